// Package syncbuf is a byte buffer that one goroutine may read while
// others write to it: the log sink tests read while a server logs.
//
// # Responsibility
//
// Buffer alone. It is for tests: production code writes its logs to
// files and terminals, never to a buffer it reads back.
//
// # Ownership and concurrency
//
// A Buffer belongs to whoever declared it; its zero value is ready. Write
// and String are safe for concurrent use.
package syncbuf
