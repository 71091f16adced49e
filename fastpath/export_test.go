package fastpath

// Redact is redact, for the tests of what reaches the log.
var Redact = redact

// ClientWentAway is clientWentAway, for its test.
var ClientWentAway = clientWentAway
