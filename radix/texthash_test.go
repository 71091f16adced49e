package radix

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestApproxHashes(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 10)) // 450 bytes
	seed := ApproxSeed(12345)
	t.Run("full chunks only", func(t *testing.T) {
		h := AppendApproxHashes(nil, seed, text, 64)
		if len(h) != len(text)/64 {
			t.Fatalf("%d hashes for %d bytes", len(h), len(text))
		}
	})
	t.Run("shared prefix shares hashes", func(t *testing.T) {
		a := AppendApproxHashes(nil, seed, text, 64)
		longer := append(slices.Clone(text), "and then some more text to extend the prompt beyond"...)
		b := AppendApproxHashes(nil, seed, longer, 64)
		if !slices.Equal(a, b[:len(a)]) {
			t.Fatal("extending a prompt changed the hashes of its prefix")
		}
		changed := slices.Clone(text)
		changed[100] ^= 1
		c := AppendApproxHashes(nil, seed, changed, 64)
		if !slices.Equal(c[:1], a[:1]) || slices.Equal(c[1:], a[1:]) {
			t.Fatal("a change in chunk 1 must keep chunk 0 and change every later hash")
		}
	})
	t.Run("chained", func(t *testing.T) {
		h := AppendApproxHashes(nil, seed, text, 64)
		again := AppendApproxHashes(nil, h[0], text[64:], 64)
		if !slices.Equal(h[1:], again) {
			t.Fatal("a chunk's hash is not derived from its parent's")
		}
	})
	t.Run("namespaces apart", func(t *testing.T) {
		if ApproxSeed(1) == ApproxSeed(2) || ApproxSeed(1) == 1 {
			t.Fatal("approx seeds collide")
		}
		a := AppendApproxHashes(nil, ApproxSeed(1), text, 64)
		b := AppendApproxHashes(nil, ApproxSeed(2), text, 64)
		if a[0] == b[0] {
			t.Fatal("different namespaces share a hash")
		}
	})
	t.Run("appends", func(t *testing.T) {
		h := AppendApproxHashes([]uint64{7}, seed, text, 64)
		if h[0] != 7 || len(h) != 1+len(text)/64 {
			t.Fatal("did not append")
		}
	})
	t.Run("bad chunk size panics", func(t *testing.T) {
		defer func() {
			if r := recover(); r == nil || !strings.HasPrefix(fmt.Sprint(r), "BUG:") {
				t.Fatalf("recover = %v", r)
			}
		}()
		AppendApproxHashes(nil, seed, text, 0)
	})
}

// BenchmarkApproxHashes measures approximate chunk hashing of a 16 KB prompt.
func BenchmarkApproxHashes(b *testing.B) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 360))
	dst := make([]uint64, 0, len(text)/DefaultApproxChunkBytes)
	seed := ApproxSeed(1)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendApproxHashes(dst[:0], seed, text, DefaultApproxChunkBytes)
	}
	b.ReportMetric(float64(b.N*len(dst))/b.Elapsed().Seconds(), "chunks/s")
}

// TestAppendEmbedsHashes: a prompt_embeds tensor is estimated at
// EmbedsBytesPerToken, at least one block, and hashed on its head, never
// into more hashes than its estimated blocks; the same tensor hashes the
// same.
func TestAppendEmbedsHashes(t *testing.T) {
	seed := ApproxSeed(NamespaceSeed("m", "", ""))
	big := bytes.Repeat([]byte("QUJD"), 64<<10) // 256 KiB of base64
	hashes, tokens := AppendEmbedsHashes(nil, seed, big, DefaultApproxChunkBytes, 16)
	if tokens != len(big)/EmbedsBytesPerToken || len(hashes) != min(EmbedsHashedBytes/DefaultApproxChunkBytes, tokens/16) {
		t.Errorf("%d bytes: %d tokens, %d hashes", len(big), tokens, len(hashes))
	}
	again, _ := AppendEmbedsHashes(nil, seed, big, DefaultApproxChunkBytes, 16)
	if !slices.Equal(hashes, again) {
		t.Error("the same tensor hashed differently")
	}
	small := big[:1000]
	hashes, tokens = AppendEmbedsHashes([]uint64{7}, seed, small, DefaultApproxChunkBytes, 16)
	if tokens != 16 || len(hashes) != 2 || hashes[0] != 7 {
		t.Errorf("%d bytes: %d tokens, hashes %v; want one block, one hash after dst's", len(small), tokens, hashes)
	}
}
