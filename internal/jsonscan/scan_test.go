package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// valid reports whether b is one JSON document by the scanners' verdict.
func valid(b []byte) bool {
	i := SkipValue(b, SkipSpace(b, 0), 0)
	return i >= 0 && SkipSpace(b, i) == len(b)
}

func TestSkipValueAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{
		``, ` `, `0`, `-0`, `-`, `01`, `1.`, `.5`, `1.5e`, `1e+5`, `-0.0E-2`, `2E3`,
		`true`, `tru`, `truex`, `null`, `nul`, `false`,
		`""`, `"a`, `"\u12"`, `"\u12g4"`, `"\q"`, `"a\"b"`, "\"a\tb\"", `"\ud800"`, "\"\xff\"",
		`[]`, `[`, `[1,]`, `[,1]`, `[1 2]`, `[[[]]]`, ` [ 1 , [ 2 ] ] `,
		`{}`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1 "b":2}`, `{1:2}`, `{"a":{"b":[{"c":null}]}}`,
		`{"a":1}}`, `[1]]`, `{"a":[1}`, `[{"a":1]}`, `1 2`,
	} {
		if got, want := valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("%q: scanners say valid=%v, encoding/json %v", s, got, want)
		}
	}
}

func TestSkipValueDepth(t *testing.T) {
	// Around the two-word bit stack and at the encoding/json limit, for both
	// container kinds.
	for _, n := range []int{1, 127, 128, 129, MaxDepth - 1, MaxDepth, MaxDepth + 1} {
		for _, open := range []string{"[", `{"k":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			doc := []byte(strings.Repeat(open, n) + strings.Repeat(close, n))
			if got, want := valid(doc), json.Valid(doc); got != want {
				t.Fatalf("depth %d (%s): scanners say valid=%v, encoding/json %v", n, open, got, want)
			}
		}
	}
	// A value already inside open containers has less room.
	doc := []byte(strings.Repeat("[", 10) + strings.Repeat("]", 10))
	if SkipValue(doc, 0, MaxDepth-10) != len(doc) || SkipValue(doc, 0, MaxDepth-9) != -1 {
		t.Fatal("the depth of the enclosing containers is not counted")
	}
}

func TestScanStringReportsEscapes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		end     int
		escaped bool
	}{
		{`"plain" x`, 7, false},
		{`"a longer plain string crossing words"`, 38, false},
		{`"tab\tand quote\""`, 18, true},
		{`"\u00e9"`, 8, true},
		{`"open`, -1, false},
		{`"bad \x"`, -1, true},
	} {
		end, escaped := ScanString([]byte(tc.in), 0)
		if end != tc.end || (end > 0 && escaped != tc.escaped) {
			t.Errorf("ScanString(%q) = %d, %v; want %d, %v", tc.in, end, escaped, tc.end, tc.escaped)
		}
	}
}

func TestAppendUnescaped(t *testing.T) {
	for _, s := range []string{
		`plain`, `a\"b\\c\/d`, `\b\f\n\r\t`, `\u00e9\u4e2d`, `\ud83d\ude00`,
		`lone \ud800 high`, `lone \udc00 low`, `\ud800\u0041`, `\ud800`,
	} {
		var want string
		if err := json.Unmarshal([]byte(`"`+s+`"`), &want); err != nil {
			t.Fatal(err)
		}
		if got := AppendUnescaped([]byte("pre"), []byte(s)); string(got) != "pre"+want {
			t.Errorf("AppendUnescaped(%q) = %q, want %q", s, got[3:], want)
		}
	}
}

func TestAppendQuoted(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\`, "line\nbreak \x01\x1f", "é😀", "bad \xff\xfe utf-8", "cut \xe2\x82"} {
		out := AppendQuoted([]byte("pre"), s)
		if string(out[:3]) != "pre" {
			t.Fatal("AppendQuoted did not append")
		}
		var got string
		if err := json.Unmarshal(out[3:], &got); err != nil {
			t.Fatalf("%q quoted as %s: %v", s, out[3:], err)
		}
		if want := string([]rune(s)); got != want {
			t.Errorf("%q quoted as %s decodes to %q, want %q", s, out[3:], got, want)
		}
	}
}

// FuzzScan checks the scanners against encoding/json: the same verdict on
// every document, the same contents for every string.
func FuzzScan(f *testing.F) {
	for _, s := range []string{`{"a":[1,-2.5e3,true,null,"x\u00e9"]}`, `[[[]]]`, `"\ud83d\ude00"`, `01`, `{"a" 1}`, "\"\x01\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := valid(b), json.Valid(b); got != want {
			t.Fatalf("scanners say valid=%v, encoding/json %v", got, want)
		}
		i := SkipSpace(b, 0)
		if i >= len(b) || b[i] != '"' {
			return
		}
		end, escaped := ScanString(b, i)
		if end < 0 {
			return
		}
		var want string
		if err := json.Unmarshal(b[i:end], &want); err != nil {
			t.Fatalf("ScanString accepted %q: %v", b[i:end], err)
		}
		raw := b[i+1 : end-1]
		got := raw
		if escaped {
			got = AppendUnescaped(nil, raw)
		}
		// encoding/json turns invalid UTF-8 into U+FFFD; the scanners keep
		// the bytes.
		if utf8.Valid(got) && string(got) != want {
			t.Fatalf("contents %q, want %q", got, want)
		}
		quoted := AppendQuoted(nil, want)
		var back string
		if err := json.Unmarshal(quoted, &back); err != nil || back != want {
			t.Fatalf("AppendQuoted(%q) = %s, decodes to %q (%v)", want, quoted, back, err)
		}
	})
}
