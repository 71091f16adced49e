package feed

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mpNotation writes msgpack the way msgspec does, from a readable
// notation, so that the conformance specs can show each engine's payload
// as the engine builds it:
//
//	null true false        nil and booleans
//	12  -5  18446744073709551615
//	                       integers, in the smallest encoding (msgspec's):
//	                       non-negative as positive fixint or uint8..64,
//	                       negative as negative fixint or int8..64
//	1.5  1e9               float64 (a '.' or an exponent makes a float)
//	"text"                 str (Go escapes)
//	x"00ff"                bin, in hex
//	[a, b]  {"k": v}       array and map, in the order written
func mpNotation(t testing.TB, src string) []byte {
	t.Helper()
	p := notationParser{src: src}
	var buf bytes.Buffer
	p.value(&buf)
	p.space()
	if p.err == nil && p.pos != len(p.src) {
		p.fail("trailing text")
	}
	if p.err != nil {
		t.Fatalf("msgpack notation: %v", p.err)
	}
	return buf.Bytes()
}

type notationParser struct {
	src string
	pos int
	err error
}

func (p *notationParser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("at %d (%q): %s", p.pos, p.src[p.pos:min(p.pos+20, len(p.src))], fmt.Sprintf(format, args...))
	}
}

func (p *notationParser) space() {
	for p.pos < len(p.src) && strings.ContainsRune(" \t\r\n", rune(p.src[p.pos])) {
		p.pos++
	}
}

func (p *notationParser) must(err error) {
	if err != nil {
		p.fail("%v", err)
	}
}

// encoder writes to w in msgspec's integer encoding.
func encoder(w *bytes.Buffer) *msgpack.Encoder {
	e := msgpack.NewEncoder(w)
	e.UseCompactInts(true)
	return e
}

func (p *notationParser) value(w *bytes.Buffer) {
	e := encoder(w)
	p.space()
	if p.err != nil || p.pos >= len(p.src) {
		p.fail("want a value")
		return
	}
	rest := p.src[p.pos:]
	switch c := rest[0]; {
	case strings.HasPrefix(rest, "null"):
		p.pos += 4
		p.must(e.EncodeNil())
	case strings.HasPrefix(rest, "true"), strings.HasPrefix(rest, "false"):
		v := rest[0] == 't'
		p.pos += map[bool]int{true: 4, false: 5}[v]
		p.must(e.EncodeBool(v))
	case c == '"':
		p.must(e.EncodeString(p.quoted()))
	case c == 'x' && len(rest) > 1 && rest[1] == '"':
		p.pos++
		b, err := hex.DecodeString(p.quoted())
		p.must(err)
		p.must(e.EncodeBytes(b))
	case c == '[':
		p.list(w, ']', p.value, e.EncodeArrayLen)
	case c == '{':
		p.list(w, '}', func(w *bytes.Buffer) {
			p.value(w)
			p.space()
			if p.pos >= len(p.src) || p.src[p.pos] != ':' {
				p.fail("want ':'")
				return
			}
			p.pos++
			p.value(w)
		}, e.EncodeMapLen)
	case c == '-' || c >= '0' && c <= '9':
		p.number(e)
	default:
		p.fail("want a value")
	}
}

func (p *notationParser) quoted() string {
	end := p.pos + 1
	for end < len(p.src) && p.src[end] != '"' {
		if p.src[end] == '\\' {
			end++
		}
		end++
	}
	if end >= len(p.src) {
		p.fail("unterminated string")
		return ""
	}
	s, err := strconv.Unquote(p.src[p.pos : end+1])
	p.must(err)
	p.pos = end + 1
	return s
}

// list encodes the items up to close, which it has to count first: a
// msgpack container starts with its length.
func (p *notationParser) list(w *bytes.Buffer, close byte, item func(*bytes.Buffer), header func(int) error) {
	var inner bytes.Buffer
	p.pos++
	n := 0
	for {
		p.space()
		if p.err != nil || p.pos >= len(p.src) {
			p.fail("unterminated %c", close)
			return
		}
		if p.src[p.pos] == close {
			p.pos++
			break
		}
		if n > 0 {
			if p.src[p.pos] != ',' {
				p.fail("want ',' or %c", close)
				return
			}
			p.pos++
		}
		item(&inner)
		n++
	}
	p.must(header(n))
	w.Write(inner.Bytes())
}

func (p *notationParser) number(e *msgpack.Encoder) {
	// msgspec writes a non-negative int in the uint family, a negative one
	// in the int family, each in the fewest bytes.
	end := p.pos + 1
	for end < len(p.src) && strings.ContainsRune("0123456789.eE+-", rune(p.src[end])) {
		end++
	}
	tok := p.src[p.pos:end]
	p.pos = end
	if strings.ContainsAny(tok, ".eE") {
		f, err := strconv.ParseFloat(tok, 64)
		p.must(err)
		p.must(e.EncodeFloat64(f))
		return
	}
	if tok[0] == '-' {
		v, err := strconv.ParseInt(tok, 10, 64)
		p.must(err)
		p.must(e.EncodeInt(v))
		return
	}
	u, err := strconv.ParseUint(tok, 10, 64)
	p.must(err)
	p.must(e.EncodeUint(u))
}

func TestMPNotation(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want []byte
	}{
		{`null`, []byte{0xc0}},
		{`[1, -1, 200, -200, 18446744073709551615, -9223372036854775808]`, []byte{0x96, 0x01, 0xff, 0xcc, 200, 0xd1, 0xff, 0x38,
			0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}},
		{`{"a": x"0102", "b": [true, false]}`, []byte{0x82, 0xa1, 'a', 0xc4, 2, 1, 2, 0xa1, 'b', 0x92, 0xc3, 0xc2}},
		{`1.5`, []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
		{`[[], {}]`, []byte{0x92, 0x90, 0x80}},
	} {
		if got := mpNotation(t, tc.src); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: got % x, want % x", tc.src, got, tc.want)
		}
	}
	var v any
	if err := msgpack.Unmarshal(mpNotation(t, `[1.5e0, "x\"y"]`), &v); err != nil || fmt.Sprint(v) != `[1.5 x"y]` {
		t.Fatalf("round trip: %v %v", v, err)
	}
}
