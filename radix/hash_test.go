package radix

import (
	"encoding/binary"
	"math/bits"
	"testing"
)

// xxh64Reference is XXH64 written from the published specification, kept
// deliberately naive. It is the independent oracle that shows the scheme in
// docs/hashing.md is plain XXH64 and can be reproduced from the spec alone.
func xxh64Reference(input []byte, seed uint64) uint64 {
	const (
		p1 uint64 = 11400714785074694791
		p2 uint64 = 14029467366897019727
		p3 uint64 = 1609587929392839161
		p4 uint64 = 9650029242287828579
		p5 uint64 = 2870177450012600261
	)
	round := func(acc, lane uint64) uint64 {
		return bits.RotateLeft64(acc+lane*p2, 31) * p1
	}
	merge := func(acc, v uint64) uint64 {
		return (acc^round(0, v))*p1 + p4
	}
	n := len(input)
	var acc uint64
	if n >= 32 {
		v1, v2, v3, v4 := seed+p1+p2, seed+p2, seed, seed-p1
		for len(input) >= 32 {
			v1 = round(v1, binary.LittleEndian.Uint64(input[0:]))
			v2 = round(v2, binary.LittleEndian.Uint64(input[8:]))
			v3 = round(v3, binary.LittleEndian.Uint64(input[16:]))
			v4 = round(v4, binary.LittleEndian.Uint64(input[24:]))
			input = input[32:]
		}
		acc = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		acc = merge(merge(merge(merge(acc, v1), v2), v3), v4)
	} else {
		acc = seed + p5
	}
	acc += uint64(n)
	for len(input) >= 8 {
		acc ^= round(0, binary.LittleEndian.Uint64(input))
		acc = bits.RotateLeft64(acc, 27)*p1 + p4
		input = input[8:]
	}
	if len(input) >= 4 {
		acc ^= uint64(binary.LittleEndian.Uint32(input)) * p1
		acc = bits.RotateLeft64(acc, 23)*p2 + p3
		input = input[4:]
	}
	for _, b := range input {
		acc ^= uint64(b) * p5
		acc = bits.RotateLeft64(acc, 11) * p1
	}
	acc ^= acc >> 33
	acc *= p2
	acc ^= acc >> 29
	acc *= p3
	acc ^= acc >> 32
	return acc
}

// referenceChain is one step of docs/hashing.md, written from the document
// rather than from hash.go: field arithmetic by division and remainder, the
// SplitMix64 finaliser spelled out.
func referenceChain(parent uint64, block []byte) uint64 {
	mix := parent
	mix = (mix ^ mix>>30) * 0xbf58476d1ce4e5b9
	mix = (mix ^ mix>>27) * 0x94d049bb133111eb
	mix ^= mix >> 31
	raw := xxh64Reference(block, 0) ^ mix

	const freshSpan, counterSpan = 1 << 34, 8 // fresh: bits 0..33; counter: bits 34..36
	parentCounter := parent / freshSpan % counterSpan
	rawFresh := raw % freshSpan
	if parentCounter == 7 { // anchor: counter 0, group and fresh bits from raw
		rawGroup := raw / (freshSpan * counterSpan)
		return rawGroup*(freshSpan*counterSpan) + 0*freshSpan + rawFresh
	}
	parentGroup := parent / (freshSpan * counterSpan)
	return parentGroup*(freshSpan*counterSpan) + (parentCounter+1)*freshSpan + rawFresh
}

func referenceBlockHashes(seed uint64, tokens []uint32, blockSize int) []uint64 {
	var out []uint64
	parent := seed
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		buf := make([]byte, 0, 4*blockSize)
		for _, t := range tokens[i : i+blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		parent = referenceChain(parent, buf)
		out = append(out, parent)
	}
	return out
}

func referenceNamespaceSeed(model, lora, salt string) uint64 {
	b := []byte("kvfast/v2\x00" + model + "\x00" + lora + "\x00" + salt)
	return xxh64Reference(b, 0) | 7<<34
}

func seqTokens(n int, start uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = start + uint32(i)
	}
	return t
}

// The vectors below are the ones published in docs/hashing.md. If this test
// changes, the hashing scheme changed: bump the namespace domain and the
// document, because every publisher in every language must follow.
func TestHashVectors(t *testing.T) {
	if got := xxh64Reference(nil, 0); got != 0xef46db3751d8e999 {
		t.Fatalf("reference XXH64 of empty input = %#x, the spec says 0xef46db3751d8e999", got)
	}
	vectors := []struct {
		name              string
		model, lora, salt string
		tokens            []uint32
		blockSize         int
		seed              uint64
		hashes            []uint64
	}{
		{name: "two blocks of 4", model: "llama-3-8b", tokens: seqTokens(8, 0), blockSize: 4,
			seed: 0xdd64c31d3f659eec, hashes: []uint64{0xcfb3a3238b03cfd7, 0xcfb3a32497c13447}},
		{name: "partial tail ignored", model: "llama-3-8b", tokens: seqTokens(10, 0), blockSize: 4,
			seed: 0xdd64c31d3f659eec, hashes: []uint64{0xcfb3a3238b03cfd7, 0xcfb3a32497c13447}},
		{name: "lora and salt", model: "llama-3-8b", lora: "sql-adapter", salt: "tenant-7", tokens: seqTokens(16, 100), blockSize: 16,
			seed: 0xd36f291fc0d97bb5, hashes: []uint64{0x7d95ff002b112ea8}},
		{name: "a group boundary", model: "llama-3-8b", tokens: seqTokens(40, 0), blockSize: 4,
			seed: 0xdd64c31d3f659eec, hashes: []uint64{
				0xcfb3a3238b03cfd7, 0xcfb3a32497c13447, 0xcfb3a329f6bed87a, 0xcfb3a32e727c91b6, 0xcfb3a333c13fae35,
				0xcfb3a334e7133ac2, 0xcfb3a33b40149b25, 0xcfb3a33ed62f913e, 0x4175c88349735a0c, 0x4175c885e4f1f7a1}},
	}
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			seed := NamespaceSeed(v.model, v.lora, v.salt)
			if ref := referenceNamespaceSeed(v.model, v.lora, v.salt); seed != ref {
				t.Fatalf("seed %#x, reference %#x", seed, ref)
			}
			got := AppendBlockHashes(nil, seed, v.tokens, v.blockSize)
			want := referenceBlockHashes(seed, v.tokens, v.blockSize)
			if len(got) != len(want) {
				t.Fatalf("%d hashes, reference gives %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("hash %d = %#x, reference %#x", i, got[i], want[i])
				}
			}
			t.Logf("seed=%#x hashes=%#x", seed, got)
			if len(got) != len(v.hashes) {
				t.Fatalf("%d hashes, published vector has %d", len(got), len(v.hashes))
			}
			if seed != v.seed {
				t.Errorf("seed %#x, published vector %#x", seed, v.seed)
			}
			for i := range got {
				if got[i] != v.hashes[i] {
					t.Errorf("hash %d = %#x, published vector %#x", i, got[i], v.hashes[i])
				}
			}
		})
	}
}

func TestChainBlockHashContinuesAPrefix(t *testing.T) {
	seed := NamespaceSeed("m", "", "")
	tokens := seqTokens(64, 7)
	all := AppendBlockHashes(nil, seed, tokens, 16)
	parent := seed
	for i, want := range all {
		got := ChainBlockHash(parent, tokens[i*16:(i+1)*16])
		if got != want {
			t.Fatalf("block %d: ChainBlockHash %#x, AppendBlockHashes %#x", i, got, want)
		}
		parent = got
	}
}

func TestNamespacesSeparate(t *testing.T) {
	tokens := seqTokens(16, 1)
	seen := map[uint64]string{}
	for _, ns := range [][3]string{{"a", "", ""}, {"b", "", ""}, {"a", "x", ""}, {"a", "", "x"}, {"a\x00", "", ""}, {"", "a", ""}} {
		h := AppendBlockHashes(nil, NamespaceSeed(ns[0], ns[1], ns[2]), tokens, 16)[0]
		if prev, dup := seen[h]; dup {
			t.Fatalf("namespaces %q and %v share block hash %#x", prev, ns, h)
		}
		seen[h] = ns[0] + "|" + ns[1] + "|" + ns[2]
	}
}
