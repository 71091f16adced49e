// Command unreached reports the functions of a Go module that no call path
// from a main function reaches.
//
// It answers "does production ever run this?", which golang.org/x/tools'
// deadcode cannot: deadcode's analysis (RTA) counts every exported method of
// a type that is ever stored in an interface as reachable, because
// reflection might call it. A *Call kept in a sync.Pool thus keeps all its
// exported methods alive, used or not. unreached builds the same RTA call
// graph but counts only its edges, static and dynamic (interface and
// func-value calls), from main and init: a function that only reflection
// could reach is reported. Code that only templates or other reflective
// callers run belongs in the allow-list, with that reason.
//
// Usage:
//
//	unreached [-test] [-allow file] packages...
//
// Without -test the roots are the main packages among the named ones (the
// binaries); with -test, the test executables too. Reports are
// "file:line:col: key", key being "<package dir>.<Func or Type.Method>",
// e.g. "dispatch.Call.Items". The allow file lists keys to accept, one per
// line with the reason after it; # starts a comment. An entry without a
// reason, or one that matches nothing any more, is an error, so the list
// cannot rot. The exit status is 1 when anything is reported.
package main
