// Package redact makes an endpoint, URL or address, or an engine's
// unreadable answer, safe to show in a log line or an error, wherever it
// came from (a flag, the environment, an engine's registration in the
// segment, an engine's bytes): whatever may be a credential is replaced.
//
// # Responsibility
//
// Endpoint is the one rule every package that shows an endpoint applies
// (node's registrations and --worker, epp's --endpoint, feed's ZMQ
// sockets). It is deliberately blunt. An endpoint is shown only so that
// an operator can tell which one is meant, so taking too much (a query
// that held no key, the part of a password before a comma) costs nothing,
// while taking too little leaks a secret into the journal.
//
// AnswerError does the same for the error of an engine answer that could
// not be read as HTTP (dispatch's calls and health checks, the remote
// tokenizer): the HTTP library quotes the bytes it could not parse, which
// an engine echoing its request fills with the engines' key and a prompt.
//
// # Ownership and concurrency
//
// Endpoint and AnswerError are pure functions of their arguments: they
// keep nothing and may be called from any goroutine.
package redact
