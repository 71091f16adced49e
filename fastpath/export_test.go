package fastpath

// Redact is redact, for the tests of what reaches the log.
var Redact = redact

// ClientWentAway is clientWentAway, for its test.
var ClientWentAway = clientWentAway

// EagerBodyBytes is eagerBodyBytes: what a body declared longer is
// charged before its bytes arrive.
const EagerBodyBytes = eagerBodyBytes

// SetMaxPendingCloses sets maxPendingCloses until the returned restore.
func SetMaxPendingCloses(n int64) (restore func()) {
	old := maxPendingCloses
	maxPendingCloses = n
	return func() { maxPendingCloses = old }
}
