// Command prog is unreached's test subject: each function's comment says
// what unreached must make of it.
package main

import (
	"fmt"
	"sync"
)

// T is stored in an interface (the sync.Pool), which makes deadcode count
// all its exported methods as reachable.
type T struct{}

// Used is called: reached.
func (*T) Used() {}

// OnlyReflection is exported but never called: reported.
func (*T) OnlyReflection() {}

// unexported is never called: reported.
func (*T) unexported() {}

// S reaches String only through the fmt.Stringer interface: reached.
type S struct{}

func (S) String() string { return "s" }

var pool = sync.Pool{New: func() any { return new(T) }}

// dead is never called: reported.
func dead() {}

// onlyTest is called by a test alone: reported without -test.
func onlyTest() {}

// generic is called through an instance: reached.
func generic[E any](e E) E { return e }

func main() {
	pool.Get().(*T).Used()
	fmt.Println(S{}, generic(1))
}
