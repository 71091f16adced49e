//go:build !race

package jsonscan

import (
	"strings"
	"testing"
)

func TestScanAllocations(t *testing.T) {
	for _, doc := range []string{
		`{"a":[1,-2.5e3,true,null,"x\u00e9"],"b":{"c":"` + strings.Repeat("text ", 100) + `"}}`,
		strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), // the deep bit stack
	} {
		b := []byte(doc)
		if n := testing.AllocsPerRun(20, func() {
			if SkipValue(b, 0, 0) != len(b) {
				t.Fatal("rejected")
			}
		}); n != 0 {
			t.Fatalf("SkipValue made %v allocations", n)
		}
	}
	raw := []byte(`a\"b\u00e9\ud83d\ude00`)
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(50, func() {
		buf = AppendUnescaped(buf[:0], raw)
		buf = AppendQuoted(buf, "message with \"quotes\"\n and \xff")
	}); n != 0 {
		t.Fatalf("AppendUnescaped and AppendQuoted made %v allocations", n)
	}
}
