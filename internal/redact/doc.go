// Package redact makes an endpoint, URL or address safe to show in a log
// line or an error, wherever it came from (a flag, the environment, an
// engine's registration in the segment): whatever may be a credential is
// replaced.
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
// # Ownership and concurrency
//
// Endpoint is a pure function of its argument: it keeps nothing and may
// be called from any goroutine.
package redact
