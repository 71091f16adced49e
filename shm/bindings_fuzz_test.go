package shm

import (
	"encoding/binary"
	"testing"
)

// FuzzBindings runs the table's operations over arbitrary region bytes, as
// a corrupt or hostile segment would present them: nothing may panic or
// read outside the region, and a lookup returns only what a way holds.
func FuzzBindings(f *testing.F) {
	b, _ := NewBindings(MinBindings * 2)
	b.Bind(b.Key([]byte("a")), 1, 2, 10, testTTL)
	f.Add(append([]byte(nil), b.mem...), []byte("a"), int64(10))
	f.Add(make([]byte, bindingBucketSize), []byte("b"), int64(-1))
	f.Fuzz(func(t *testing.T, region, id []byte, now int64) {
		n := 1
		for n*bindingBucketSize < len(region) && n < 64 {
			n <<= 1
		}
		mem := aligned(make([]byte, n*bindingBucketSize))
		copy(mem, region)
		// A lock word far in the future makes every writer spin its
		// bounded tries and give up; that must end too.
		tb, err := attachBindings(mem, binary.LittleEndian.Uint64(mem[8:]))
		if err != nil {
			t.Fatal(err)
		}
		k := tb.Key(id)
		if got, r := tb.Lookup(k, now, testTTL); r == BindingHit && now-got.Touched > testTTL {
			t.Fatalf("hit on an entry idle past the TTL: %+v at %d", got, now)
		}
		tb.Bind(k, 3, 4, now, testTTL)
		tb.Live(now, testTTL)
		tb.Unbind(k, 3, 4, now)
	})
}
