package main

import (
	"bytes"
	"testing"
)

// kvfast soak refuses an eviction weight the router would refuse, before
// it starts anything.
func TestSoakRefusesBadEvictionWeight(t *testing.T) {
	for _, v := range []string{"-1", "NaN", "+Inf", "x"} {
		var stdout, stderr bytes.Buffer
		if code := soakCommand(t.Context(), []string{"--eviction-weight", v}, &stdout, &stderr); code != 2 {
			t.Errorf("--eviction-weight %s: exit %d, want 2 (%s)", v, code, stderr.String())
		}
	}
}
