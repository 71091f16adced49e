// Package jsonscan holds the JSON primitives kvfast's wire-format readers
// are built from: skip whitespace, scan a string, number or literal, skip a
// whole value, decode a string's escapes, and, the other way, quote a
// string. It builds no tree and knows no schema; openai walks request
// bodies and stream chunks with it, and the mock engine reuses it.
//
// # Responsibility
//
// Validation is as strict as encoding/json's: a value these functions accept
// is one encoding/json accepts, nesting included (MaxDepth). Every scanner
// takes the buffer and an index and returns the index just after what it
// scanned, or -1 when the bytes there are not valid JSON, so callers can
// chain them without slicing and never read out of bounds. Containers are
// skipped without recursion, so hostile nesting costs a bit per level, not a
// stack frame.
//
// # What it owns
//
// Nothing: every function works on the caller's bytes and appends to the
// caller's buffers, and none allocates beyond growing those buffers.
//
// # Concurrency
//
// All functions are pure and safe for concurrent use on shared input.
package jsonscan
