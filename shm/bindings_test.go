package shm

import (
	"fmt"
	"sync"
	"testing"
)

const testTTL = int64(10e9)

func TestBindingsBindRefreshExpire(t *testing.T) {
	b, err := NewBindings(MinBindings)
	if err != nil {
		t.Fatal(err)
	}
	k := b.Key([]byte("conversation-1"))
	if _, r := b.Lookup(k, 100, testTTL); r != BindingMiss {
		t.Fatalf("empty table: lookup = %v, want a miss", r)
	}
	if r := b.Bind(k, 7, 2, 100, testTTL); r != BindNew {
		t.Fatalf("first bind = %v, want BindNew", r)
	}
	got, r := b.Lookup(k, 100+testTTL, testTTL)
	if r != BindingHit || got.WorkerID != 7 || got.DPRank != 2 || got.Touched != 100 {
		t.Fatalf("lookup at the TTL = %+v, %v; want worker 7 rank 2 touched 100", got, r)
	}
	// A refresh moves the idle clock: the binding outlives its first TTL.
	if r := b.Bind(k, 7, 2, 200, testTTL); r != BindRefreshed {
		t.Fatalf("refresh = %v, want BindRefreshed", r)
	}
	if _, r := b.Lookup(k, 150+testTTL, testTTL); r != BindingHit {
		t.Fatalf("after a refresh, lookup = %v, want a hit", r)
	}
	for range 2 {
		if _, r := b.Peek(k, 201+testTTL, testTTL); r != BindingExpired {
			t.Fatalf("idle past the TTL, peek = %v, want BindingExpired (a peek removes nothing)", r)
		}
	}
	if _, r := b.Lookup(k, 201+testTTL, testTTL); r != BindingExpired {
		t.Fatalf("idle past the TTL, lookup = %v, want BindingExpired", r)
	}
	if _, r := b.Lookup(k, 201+testTTL, testTTL); r != BindingMiss {
		t.Fatalf("an expired binding is removed by the lookup that found it; second lookup = %v", r)
	}
	if n := b.Live(0, testTTL); n != 0 {
		t.Fatalf("Live = %d after expiry", n)
	}
}

func TestBindingsRebindAndUnbind(t *testing.T) {
	b, _ := NewBindings(MinBindings)
	k := b.Key([]byte("s"))
	b.Bind(k, 1, 0, 10, testTTL)
	if r := b.Bind(k, 2, 0, 20, testTTL); r != BindReplaced {
		t.Fatalf("binding to another worker = %v, want BindReplaced", r)
	}
	// An unbind naming the old worker must not undo the rebind.
	if b.Unbind(k, 1, 0, 30) {
		t.Fatal("Unbind of a stale target removed the new binding")
	}
	if got, r := b.Lookup(k, 30, testTTL); r != BindingHit || got.WorkerID != 2 {
		t.Fatalf("lookup = %+v, %v; want worker 2", got, r)
	}
	if !b.Unbind(k, 2, 0, 40) {
		t.Fatal("Unbind of the current target removed nothing")
	}
	if _, r := b.Lookup(k, 40, testTTL); r != BindingMiss {
		t.Fatalf("after Unbind, lookup = %v", r)
	}
}

// Claim binds only a session with no live binding, and hands back the
// one that holds; Touch refreshes only a binding still naming its worker,
// even one idle past the TTL that no lookup has removed yet.
func TestBindingsClaimAndTouch(t *testing.T) {
	b, _ := NewBindings(MinBindings)
	k := b.Key([]byte("s"))
	if got, r := b.Claim(k, 1, 0, 10, testTTL); r != BindNew || got.WorkerID != 1 {
		t.Fatalf("claim of an unbound session = %+v, %v; want worker 1, BindNew", got, r)
	}
	if got, r := b.Claim(k, 2, 0, 20, testTTL); r != BindHeld || got.WorkerID != 1 || got.Touched != 10 {
		t.Fatalf("claim of a claimed session = %+v, %v; want worker 1's binding, untouched, BindHeld", got, r)
	}
	if got, r := b.Claim(k, 2, 0, 11+testTTL, testTTL); r != BindReplaced || got.WorkerID != 2 {
		t.Fatalf("claim of an expired binding = %+v, %v; want worker 2, BindReplaced", got, r)
	}
	if b.Touch(k, 1, 0, 30) {
		t.Fatal("Touch of a binding naming another worker touched it")
	}
	// A claim is taken back only while untouched since: another request's
	// bind or touch of it makes it that request's too.
	b2, _ := NewBindings(MinBindings)
	k2 := b2.Key([]byte("s2"))
	c, _ := b2.Claim(k2, 3, 0, 40, testTTL)
	b2.Bind(k2, 3, 0, 41, testTTL) // a follower accepted
	if b2.Unclaim(k2, 3, 0, c.Touched, 42) {
		t.Fatal("Unclaim removed a binding another request bound since")
	}
	if _, r := b2.Lookup(k2, 42, testTTL); r != BindingHit {
		t.Fatalf("after a refused Unclaim, lookup = %v, want a hit", r)
	}
	k3 := b2.Key([]byte("s3"))
	c, _ = b2.Claim(k3, 3, 0, 50, testTTL)
	if !b2.Unclaim(k3, 3, 0, c.Touched, 51) {
		t.Fatal("Unclaim of an untouched claim removed nothing")
	}
	idle := 12 + 2*testTTL // worker 2's binding, made at 11+TTL, is idle past the TTL
	if _, r := b.Peek(k, idle, testTTL); r != BindingExpired {
		t.Fatalf("peek = %v, want BindingExpired", r)
	}
	if !b.Touch(k, 2, 0, idle) {
		t.Fatal("Touch of the session's own binding, idle past the TTL but not removed, did nothing")
	}
	if got, r := b.Lookup(k, idle, testTTL); r != BindingHit || got.WorkerID != 2 || got.Touched != idle {
		t.Fatalf("after Touch, lookup = %+v, %v; want worker 2 touched at %d", got, r, idle)
	}
}

// A claim evicts no live binding: in a full bucket it fails, and the
// binding is made (evicting) only once an engine accepts the request.
func TestBindingsClaimEvictsNothing(t *testing.T) {
	b, _ := NewBindings(MinBindings) // one bucket
	for i := range b.Capacity() {
		if r := b.Bind(b.Key(fmt.Appendf(nil, "s%d", i)), 1, 0, 10, testTTL); r != BindNew {
			t.Fatalf("bind %d = %v", i, r)
		}
	}
	if _, r := b.Claim(b.Key([]byte("new")), 2, 0, 20, testTTL); r != BindFailed {
		t.Fatalf("claim in a full bucket = %v, want BindFailed", r)
	}
	if n := b.Live(20, testTTL); n != b.Capacity() {
		t.Fatalf("after the claim %d live bindings, want %d", n, b.Capacity())
	}
}

func TestBindingsBoundedEvictsLeastRecentlyUsed(t *testing.T) {
	b, _ := NewBindings(MinBindings) // one bucket of bindingWays
	if b.Capacity() != bindingWays {
		t.Fatalf("capacity %d, want %d", b.Capacity(), bindingWays)
	}
	keys := make([]uint64, bindingWays+1)
	for i := range keys {
		keys[i] = b.Key(fmt.Appendf(nil, "s%d", i))
	}
	for i, k := range keys[:bindingWays] {
		if r := b.Bind(k, uint64(i), 0, int64(100+i), testTTL); r != BindNew {
			t.Fatalf("bind %d = %v", i, r)
		}
	}
	b.Bind(keys[0], 0, 0, 1000, testTTL) // keys[1] is now the least recently used
	if r := b.Bind(keys[bindingWays], 99, 0, 1001, testTTL); r != BindEvicted {
		t.Fatalf("bind into a full table = %v, want BindEvicted", r)
	}
	if _, r := b.Lookup(keys[1], 1001, testTTL); r != BindingMiss {
		t.Fatalf("the least recently used binding survived: %v", r)
	}
	for _, i := range []int{0, 2, bindingWays} {
		if _, r := b.Lookup(keys[i], 1001, testTTL); r != BindingHit {
			t.Fatalf("binding %d lost: %v", i, r)
		}
	}
	if n := b.Live(1001, testTTL); n != bindingWays {
		t.Fatalf("Live = %d, want %d", n, bindingWays)
	}
}

func TestBindingsStealDeadWritersLock(t *testing.T) {
	b, _ := NewBindings(MinBindings)
	k := b.Key([]byte("s"))
	// A writer that died holding the lock at t=5s.
	*b.word(b.bucketOf(k)) = uint64(5e9)<<1 | 1
	if r := b.Bind(k, 1, 0, 5e9+10, testTTL); r != BindFailed {
		t.Fatalf("bind while a live writer holds the lock = %v, want BindFailed", r)
	}
	if r := b.Bind(k, 1, 0, 5e9+bindingLockSteal+1, testTTL); r != BindNew {
		t.Fatalf("bind after the holder is presumed dead = %v, want BindNew", r)
	}
	if _, r := b.Lookup(k, 5e9+bindingLockSteal+1, testTTL); r != BindingHit {
		t.Fatalf("lookup after a stolen lock = %v", r)
	}
}

// Two routers attached to one segment share their bindings.
func TestBindingsSharedAcrossAttachments(t *testing.T) {
	seg, path := openTest(t, Options{Bindings: 1024})
	other, err := Open(path, Options{NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.Header().Bindings != seg.Header().Bindings || seg.Header().Bindings < 1024 {
		t.Fatalf("capacities %d and %d, asked for 1024", seg.Header().Bindings, other.Header().Bindings)
	}
	a, b := seg.Bindings(), other.Bindings()
	k := a.Key([]byte("conversation"))
	if k != b.Key([]byte("conversation")) {
		t.Fatal("two attachments hash one session id differently")
	}
	now := a.Now()
	a.Bind(k, 42, 3, now, testTTL)
	got, r := b.Lookup(k, now, testTTL)
	if r != BindingHit || got.WorkerID != 42 || got.DPRank != 3 {
		t.Fatalf("the other attachment sees %+v, %v", got, r)
	}
	if _, err := Open(path, Options{NoCreate: true, Bindings: 1 << 20}); err == nil {
		t.Fatal("attaching with another bindings capacity was accepted")
	}
}

func TestBindingsConcurrent(t *testing.T) {
	b, _ := NewBindings(MinBindings * 4)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := b.Key(fmt.Appendf(nil, "s%d", i%40))
				now := int64(i + 1)
				switch i % 3 {
				case 0:
					b.Bind(k, uint64(g), 0, now, testTTL)
				case 1:
					if got, r := b.Lookup(k, now, testTTL); r == BindingHit && got.WorkerID > 3 {
						t.Errorf("lookup read a worker nobody bound: %+v", got)
						return
					}
				default:
					b.Unbind(k, uint64(g), 0, now)
				}
			}
		}()
	}
	wg.Wait()
	for bucket := uint64(0); bucket <= b.mask; bucket++ {
		if *b.word(bucket * bindingBucketSize)&1 != 0 {
			t.Fatalf("bucket %d left locked", bucket)
		}
	}
}

// TestBindingsDistrustFutureTimes: a lock or a touch stamped far ahead of
// the clock is garbage, not a writer at work or a binding in use: the
// lock is taken over and the binding expires, so a scribbled bucket does
// not lose its sessions for good. Slightly ahead (a racing clock read) is
// still believed.
func TestBindingsDistrustFutureTimes(t *testing.T) {
	b, _ := NewBindings(MinBindings)
	k := b.Key([]byte("s"))
	const now = int64(100e9)
	*b.word(b.bucketOf(k)) = uint64(now+bindingClockSlack/2)<<1 | 1
	if r := b.Bind(k, 1, 0, now, testTTL); r != BindFailed {
		t.Fatalf("bind while a lock taken a moment ahead is held = %v, want BindFailed", r)
	}
	*b.word(b.bucketOf(k)) = uint64(now+3600e9)<<1 | 1
	if r := b.Bind(k, 1, 0, now, testTTL); r != BindNew {
		t.Fatalf("bind under a lock stamped an hour ahead = %v, want BindNew", r)
	}
	if r := b.Bind(k, 1, 0, now+3600e9, testTTL); r != BindRefreshed {
		t.Fatalf("a touch an hour ahead = %v", r)
	}
	if _, r := b.Lookup(k, now, testTTL); r != BindingExpired {
		t.Fatalf("a binding touched an hour ahead of the clock: lookup = %v, want BindingExpired", r)
	}
}
