//go:build !race

package shm

import "testing"

func TestBindingsZeroAllocs(t *testing.T) {
	seg, _ := openTest(t, Options{})
	b := seg.Bindings()
	id := []byte("conversation-1234")
	now := b.Now()
	b.Bind(b.Key(id), 1, 0, now, testTTL)
	if n := testing.AllocsPerRun(1000, func() {
		k := b.Key(id)
		if _, r := b.Lookup(k, now, testTTL); r != BindingHit {
			t.Fatal("lost the binding")
		}
		b.Bind(k, 1, 0, now, testTTL)
		b.Claim(k, 1, 0, now, testTTL)
		b.Touch(k, 1, 0, now)
		b.Unclaim(k, 2, 0, now, now)
	}); n != 0 {
		t.Fatalf("key, lookup, refresh, claim, touch and unclaim: %v allocs per run", n)
	}
}
