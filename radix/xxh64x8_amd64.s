#include "textflag.h"

// XXH64 (seed 0) of 64-byte blocks, eight at a time: one block per 64-bit
// lane of the ZMM registers, so that each multiply of eight blocks' hashes
// is one VPMULLQ. Eight blocks are loaded as rows (Z0-Z7, one block
// each) and transposed into columns (Z16-Z23, word w of every block)
// with 24 shuffles: eight VPGATHERQQs took twice as long on the
// development machine (AMD EPYC), and kept the scalar chain that runs
// beside this from overlapping it.
//
// Constants: Z24 and Z25 the first and fourth accumulators' start values
// (prime1+prime2, -prime1), Z26 prime1, Z27 prime2, Z28 prime3, Z29
// prime4, Z30 the input length (64). Accumulators v1-v4: Z8-Z11; h: Z12;
// scratch: Z13.

// round is XXH64's round: acc = rotl(acc + lane*prime2, 31) * prime1.
#define round(acc, lane) \
	VPMULLQ Z27, lane, lane; \
	VPADDQ lane, acc, acc; \
	VPROLQ $31, acc, acc; \
	VPMULLQ Z26, acc, acc

// merge folds accumulator v into h: h = (h ^ round(0, v)) * prime1 + prime4.
#define merge(v) \
	VPMULLQ Z27, v, v; \
	VPROLQ $31, v, v; \
	VPMULLQ Z26, v, v; \
	VPXORQ v, Z12, Z12; \
	VPMULLQ Z26, Z12, Z12; \
	VPADDQ Z29, Z12, Z12

// lanes 0 and 2 of a, then of b (VSHUFI64X2 picks 128-bit lanes)
#define even(a, b, dst) VSHUFI64X2 $0x88, b, a, dst
// lanes 1 and 3 of a, then of b
#define odd(a, b, dst) VSHUFI64X2 $0xDD, b, a, dst

// sums stores at off(DI) the XXH64s of the eight blocks at SI.
#define sums(off) \
	VMOVDQU64 0(SI), Z0; \
	VMOVDQU64 64(SI), Z1; \
	VMOVDQU64 128(SI), Z2; \
	VMOVDQU64 192(SI), Z3; \
	VMOVDQU64 256(SI), Z4; \
	VMOVDQU64 320(SI), Z5; \
	VMOVDQU64 384(SI), Z6; \
	VMOVDQU64 448(SI), Z7; \
	VPUNPCKLQDQ Z1, Z0, Z16; \
	VPUNPCKHQDQ Z1, Z0, Z17; \
	VPUNPCKLQDQ Z3, Z2, Z18; \
	VPUNPCKHQDQ Z3, Z2, Z19; \
	VPUNPCKLQDQ Z5, Z4, Z20; \
	VPUNPCKHQDQ Z5, Z4, Z21; \
	VPUNPCKLQDQ Z7, Z6, Z22; \
	VPUNPCKHQDQ Z7, Z6, Z23; \
	even(Z16, Z18, Z0); \
	odd(Z16, Z18, Z1); \
	even(Z17, Z19, Z2); \
	odd(Z17, Z19, Z3); \
	even(Z20, Z22, Z4); \
	odd(Z20, Z22, Z5); \
	even(Z21, Z23, Z6); \
	odd(Z21, Z23, Z7); \
	even(Z0, Z4, Z16); \
	odd(Z0, Z4, Z20); \
	even(Z1, Z5, Z18); \
	odd(Z1, Z5, Z22); \
	even(Z2, Z6, Z17); \
	odd(Z2, Z6, Z21); \
	even(Z3, Z7, Z19); \
	odd(Z3, Z7, Z23); \
	VMOVDQA64 Z24, Z8; \
	VMOVDQA64 Z27, Z9; \
	VPXORQ Z10, Z10, Z10; \
	VMOVDQA64 Z25, Z11; \
	round(Z8, Z16); \
	round(Z9, Z17); \
	round(Z10, Z18); \
	round(Z11, Z19); \
	round(Z8, Z20); \
	round(Z9, Z21); \
	round(Z10, Z22); \
	round(Z11, Z23); \
	VPROLQ $1, Z8, Z12; \
	VPROLQ $7, Z9, Z13; \
	VPADDQ Z13, Z12, Z12; \
	VPROLQ $12, Z10, Z13; \
	VPADDQ Z13, Z12, Z12; \
	VPROLQ $18, Z11, Z13; \
	VPADDQ Z13, Z12, Z12; \
	merge(Z8); \
	merge(Z9); \
	merge(Z10); \
	merge(Z11); \
	VPADDQ Z30, Z12, Z12; \
	VPSRLQ $33, Z12, Z13; \
	VPXORQ Z13, Z12, Z12; \
	VPMULLQ Z27, Z12, Z12; \
	VPSRLQ $29, Z12, Z13; \
	VPXORQ Z13, Z12, Z12; \
	VPMULLQ Z28, Z12, Z12; \
	VPSRLQ $32, Z12, Z13; \
	VPXORQ Z13, Z12, Z12; \
	VMOVDQU64 Z12, off(DI)

// link replaces the block sum at off(DI) with the block's hash, the
// chain's link (hash.go) from parent R10, and makes it the new parent.
// The chain is the critical path, so everything that depends only on the
// parent's counter and group bits is worked out beside mix64: the mask
// M of the bits the block takes from the mix (its fresh bits, or all but
// the counter for an anchor), and the bits P it takes from its parent
// (group and counter+1, or none), folded with the sum into Q = sum&M ^ P.
// The hash is then Q ^ mix64(parent)&M, two steps after the mix.
// R8 = freshMask, R9 = ^counter bits, R11 and R12 mix64's multipliers,
// R13 = 0.
#define link(off) \
	MOVQ R10, DX; \
	SHRQ $34, DX; \
	MOVL DX, BX; \
	ANDL $7, BX; \
	INCQ DX; \
	SHLQ $34, DX; \
	CMPL BX, $7; \
	MOVQ R8, BX; \
	CMOVQEQ R9, BX; \
	CMOVQEQ R13, DX; \
	MOVQ off(DI), CX; \
	ANDQ BX, CX; \
	XORQ CX, DX; \
	MOVQ R10, AX; \
	MOVQ AX, CX; \
	SHRQ $30, CX; \
	XORQ CX, AX; \
	IMULQ R11, AX; \
	MOVQ AX, CX; \
	SHRQ $27, CX; \
	XORQ CX, AX; \
	IMULQ R12, AX; \
	MOVQ AX, CX; \
	SHRQ $31, CX; \
	XORQ CX, AX; \
	ANDQ BX, AX; \
	XORQ DX, AX; \
	MOVQ AX, R10; \
	MOVQ AX, off(DI)

#define link8(off) \
	link(off+0); \
	link(off+8); \
	link(off+16); \
	link(off+24); \
	link(off+32); \
	link(off+40); \
	link(off+48); \
	link(off+56)

// func hashBlocks8(dst *uint64, src *byte, batches int, parent uint64) uint64
// Writes the chained hashes of 8*batches blocks of 64 bytes at src, whose
// first block's parent is parent, to dst, and returns the last. Software-
// pipelined: while the scalar chain links one batch, the vector unit sums
// the next.
TEXT ·hashBlocks8(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ batches+16(FP), CX
	MOVQ parent+24(FP), R10
	TESTQ CX, CX
	JZ none
	MOVQ CX, batches+16(FP) // the batches left: CX is scratch in link
	MOVQ $0x60EA27EEADC0B5D6, AX
	VPBROADCASTQ AX, Z24
	MOVQ $0x61C8864E7A143579, AX
	VPBROADCASTQ AX, Z25
	MOVQ $0x9E3779B185EBCA87, AX
	VPBROADCASTQ AX, Z26
	MOVQ $0xC2B2AE3D27D4EB4F, AX
	VPBROADCASTQ AX, Z27
	MOVQ $0x165667B19E3779F9, AX
	VPBROADCASTQ AX, Z28
	MOVQ $0x85EBCA77C2B2AE63, AX
	VPBROADCASTQ AX, Z29
	MOVQ $64, AX
	VPBROADCASTQ AX, Z30
	MOVQ $0x3FFFFFFFF, R8         // freshMask
	MOVQ $0xFFFFFFE3FFFFFFFF, R9  // ^(7 << 34)
	MOVQ $0xBF58476D1CE4E5B9, R11
	MOVQ $0x94D049BB133111EB, R12
	XORL R13, R13
	sums(0)
	ADDQ $512, SI
	DECQ batches+16(FP)
	JZ last
loop:
	sums(64)
	link8(0)
	ADDQ $64, DI
	ADDQ $512, SI
	DECQ batches+16(FP)
	JNZ loop
last:
	link8(0)
	VZEROUPPER
none:
	MOVQ R10, ret+32(FP)
	RET
