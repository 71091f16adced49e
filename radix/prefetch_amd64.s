#include "textflag.h"

// func prefetchLines(addrs []uintptr)
TEXT ·prefetchLines(SB), NOSPLIT, $0-24
	MOVQ addrs_base+0(FP), BX
	MOVQ addrs_len+8(FP), CX
	TESTQ CX, CX
	JZ done
loop:
	MOVQ (BX), AX
	PREFETCHT0 (AX)
	ADDQ $8, BX
	DECQ CX
	JNZ loop
done:
	RET
