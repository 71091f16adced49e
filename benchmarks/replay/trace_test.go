package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// decode is decodeRecord as a timed replay runs it.
func decode(line []byte, blockSize int) (Record, error) {
	rec, _, err := decodeRecord(line, blockSize, false)
	return rec, err
}

func TestDecodeRecord(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    Record
		wantErr string // substring; empty means success
	}{
		{"valid", `{"timestamp": 277, "input_length": 1100, "output_length": 92, "hash_ids": [4, 5, 6]}`,
			Record{Timestamp: 277 * time.Millisecond, InputLength: 1100, OutputLength: 92, HashIDs: []uint64{4, 5, 6}}, ""},
		{"exact multiple", `{"timestamp":0,"input_length":1024,"output_length":1,"hash_ids":[0,1]}`,
			Record{InputLength: 1024, OutputLength: 1, HashIDs: []uint64{0, 1}}, ""},
		{"Unix-epoch milliseconds", `{"timestamp":1733500000000,"input_length":1,"output_length":1,"hash_ids":[3]}`,
			Record{Timestamp: 1733500000000 * time.Millisecond, InputLength: 1, OutputLength: 1, HashIDs: []uint64{3}}, ""},
		{"fractional ms and extra fields", `{"timestamp":1.5,"input_length":1,"output_length":0,"hash_ids":[9],"session":"a"}`,
			Record{Timestamp: 1500 * time.Microsecond, InputLength: 1, HashIDs: []uint64{9}}, ""},
		{"missing timestamp", `{"input_length":1,"output_length":1,"hash_ids":[1]}`, Record{}, "timestamp is missing"},
		{"missing input", `{"timestamp":0,"output_length":1,"hash_ids":[1]}`, Record{}, "input_length is missing"},
		{"missing output", `{"timestamp":0,"input_length":1,"hash_ids":[1]}`, Record{}, "output_length is missing"},
		{"missing ids", `{"timestamp":0,"input_length":1,"output_length":1}`, Record{}, "hash_ids is missing"},
		{"empty ids", `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[]}`, Record{}, "hash_ids is missing"},
		{"negative timestamp", `{"timestamp":-1,"input_length":1,"output_length":1,"hash_ids":[1]}`, Record{}, "timestamp -1"},
		{"huge timestamp", `{"timestamp":1e300,"input_length":1,"output_length":1,"hash_ids":[1]}`, Record{}, "outside"},
		{"zero input", `{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[1]}`, Record{}, "not positive"},
		{"negative output", `{"timestamp":0,"input_length":1,"output_length":-3,"hash_ids":[1]}`, Record{}, "output_length -3"},
		{"too few ids", `{"timestamp":0,"input_length":513,"output_length":1,"hash_ids":[1]}`, Record{}, "needs 2 hash ids"},
		{"too many ids", `{"timestamp":0,"input_length":512,"output_length":1,"hash_ids":[1,2]}`, Record{}, "needs 1 hash ids"},
		{"negative id", `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[-1]}`, Record{}, "hash_ids holds -1: want non-negative integers"},
		// encoding/json takes a null in a []uint64 for 0, another block's id.
		{"null id", `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[null]}`, Record{}, "hash_ids holds null"},
		{"fractional id", `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1.5]}`, Record{}, "hash_ids holds 1.5"},
		{"fractional length", `{"timestamp":0,"input_length":1.5,"output_length":1,"hash_ids":[1]}`, Record{}, "1.5 is not a whole number"},
		{"string length", `{"timestamp":0,"input_length":"1","output_length":1,"hash_ids":[1]}`, Record{}, "is a string"},
		{"lengths written as floats, as pandas writes them", `{"timestamp":0.0,"input_length":512.0,"output_length":2e1,"hash_ids":[1]}`,
			Record{InputLength: 512, OutputLength: 20, HashIDs: []uint64{1}}, ""},
		{"not json", `timestamp=0`, Record{}, "invalid character"},
		{"array", `[1,2]`, Record{}, "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decode([]byte(tt.line), DefaultTraceBlockSize)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("block size", func(t *testing.T) {
		line := []byte(`{"timestamp":0,"input_length":20,"output_length":1,"hash_ids":[1,2,3]}`)
		if _, err := decode(line, 8); err != nil {
			t.Fatalf("3 blocks of 8 hold 20 tokens: %v", err)
		}
		if _, err := decode(line, 512); err == nil {
			t.Fatal("3 blocks of 512 accepted for 20 tokens")
		}
		if _, err := decode(line, 0); err == nil {
			t.Fatal("block size 0 accepted")
		}
	})
}

func TestReadTrace(t *testing.T) {
	t.Run("untimed records keep their place", func(t *testing.T) {
		in := `{"input_length":1,"output_length":1,"hash_ids":[1]}
{"timestamp":7,"input_length":1,"output_length":1,"hash_ids":[2]}
{"input_length":1,"output_length":1,"hash_ids":[3]}
{"timestamp":3,"input_length":1,"output_length":1,"hash_ids":[4]}
`
		if _, err := ReadTrace(strings.NewReader(in), "x", TraceOptions{}); err == nil || !strings.Contains(err.Error(), "timestamp is missing") {
			t.Fatalf("a timed read accepted a record without a timestamp: %v", err)
		}
		tr, err := ReadTrace(strings.NewReader(in), "x", TraceOptions{Untimed: true})
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint64
		var stamps []time.Duration
		for _, r := range tr.Records {
			ids, stamps = append(ids, r.HashIDs[0]), append(stamps, r.Timestamp)
		}
		// The third record takes the second's 7 ms; the fourth, timed
		// earlier, moves ahead of both.
		wantIDs := []uint64{1, 4, 2, 3}
		wantStamps := []time.Duration{0, 3 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond}
		if !reflect.DeepEqual(ids, wantIDs) || !reflect.DeepEqual(stamps, wantStamps) {
			t.Fatalf("records %v at %v, want %v at %v", ids, stamps, wantIDs, wantStamps)
		}
	})
	t.Run("error names source and line", func(t *testing.T) {
		in := `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}

{"timestamp":5,"input_length":1,"output_length":1,"hash_ids":[]}
`
		_, err := ReadTrace(strings.NewReader(in), "x.jsonl", TraceOptions{})
		var re *RecordError
		if !errors.As(err, &re) || re.Line != 3 || re.Source != "x.jsonl" {
			t.Fatalf("error = %#v, want a RecordError at x.jsonl:3", err)
		}
		if !errors.Is(err, ErrBadRecord) {
			t.Fatal("RecordError does not wrap ErrBadRecord")
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "cannot decode trace record at x.jsonl:3: hash_ids") {
			t.Fatalf("message %q", msg)
		}
	})
	t.Run("byte order mark and gzip", func(t *testing.T) {
		const in = "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[7]}\n"
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write([]byte("\ufeff" + in))
		_ = zw.Close()
		for name, data := range map[string][]byte{"bom": []byte("\ufeff" + in), "gzip with bom": gz.Bytes()} {
			tr, err := ReadTrace(bytes.NewReader(data), name, TraceOptions{})
			if err != nil || tr.Len() != 1 || tr.Records[0].HashIDs[0] != 7 {
				t.Fatalf("%s: trace %+v, error %v", name, tr, err)
			}
		}
	})
	t.Run("gzip cut short", func(t *testing.T) {
		var plain bytes.Buffer
		for i := range 2000 {
			fmt.Fprintf(&plain, `{"timestamp":%d,"input_length":1,"output_length":1,"hash_ids":[%d]}`+"\n", i, i)
		}
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(plain.Bytes())
		_ = zw.Close()
		_, err := ReadTrace(bytes.NewReader(gz.Bytes()[:gz.Len()/2]), "cut.jsonl.gz", TraceOptions{})
		if err == nil || errors.Is(err, ErrBadRecord) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error = %v, want the stream's unexpected EOF, not a bad record", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		_, err := ReadTrace(strings.NewReader("\n  \n"), "e", TraceOptions{})
		if !errors.Is(err, ErrEmptyTrace) {
			t.Fatalf("error = %v, want ErrEmptyTrace", err)
		}
	})
	t.Run("long line", func(t *testing.T) {
		in := `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}` + "\n" + strings.Repeat(" ", maxLineBytes+1)
		_, err := ReadTrace(strings.NewReader(in), "l", TraceOptions{})
		var re *RecordError
		if !errors.As(err, &re) || re.Line != 2 {
			t.Fatalf("error = %v, want a RecordError at line 2", err)
		}
	})
	t.Run("sorted by time, stable, blank lines skipped, lines kept", func(t *testing.T) {
		in := `{"timestamp":20,"input_length":1,"output_length":1,"hash_ids":[1]}

{"timestamp":10,"input_length":1,"output_length":2,"hash_ids":[2]}
{"timestamp":20,"input_length":1,"output_length":3,"hash_ids":[3]}
{"timestamp":0,"input_length":1,"output_length":4,"hash_ids":[4]}
`
		tr, err := ReadTrace(strings.NewReader(in), "s", TraceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var lines []int
		for _, r := range tr.Records {
			lines = append(lines, r.Line)
		}
		if want := []int{5, 3, 1, 4}; !reflect.DeepEqual(lines, want) {
			t.Fatalf("lines in replay order = %v, want %v", lines, want)
		}
		if tr.Span() != 20*time.Millisecond {
			t.Fatalf("span = %v", tr.Span())
		}
	})
	t.Run("max records and head", func(t *testing.T) {
		in := strings.Repeat(`{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}`+"\n", 5)
		tr, err := ReadTrace(strings.NewReader(in), "m", TraceOptions{MaxRecords: 3})
		if err != nil || tr.Len() != 3 {
			t.Fatalf("len = %d, err = %v", tr.Len(), err)
		}
		if tr.Head(2).Len() != 2 || tr.Head(0).Len() != 3 || tr.Head(9).Len() != 3 {
			t.Fatal("Head lengths wrong")
		}
	})
}

// shippedTracePath finds ../shared/traces/mooncake_synthetic.jsonl relative
// to the repository root, or takes KVFAST_TRACE; it skips when neither
// exists, since the trace lives outside the repository.
func shippedTracePath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KVFAST_TRACE"); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "traces", "mooncake_synthetic.jsonl")
			if _, err := os.Stat(p); err != nil {
				t.Skipf("shipped trace not found at %s (set KVFAST_TRACE)", p)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("repository root not found")
		}
		dir = parent
	}
}

func TestShippedTraceBound(t *testing.T) {
	tr, err := LoadTrace(shippedTracePath(t), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Len() != 3993 {
		t.Fatalf("records = %d, want 3993", tr.Len())
	}
	b := tr.HitBound(0)
	// The published figure, 0.640, counts blocks; weighting by tokens
	// gives 0.651 because a prompt's unshared tail is often a short block.
	if math.Abs(b.Blocks-0.640) > 0.001 {
		t.Errorf("block bound = %.4f, want 0.640", b.Blocks)
	}
	if math.Abs(b.Tokens-0.651) > 0.001 {
		t.Errorf("token bound = %.4f, want 0.651", b.Tokens)
	}
	// Shrinking blocks keeps the structure, so the bound barely moves.
	if s := tr.HitBound(32); math.Abs(s.Tokens-b.Tokens) > 0.01 || s.Blocks != b.Blocks {
		t.Errorf("bound at 32 tokens per block = %+v, want close to %+v", s, b)
	}
	t.Logf("shipped trace: %d records over %v, bound %.4f of tokens, %.4f of blocks", tr.Len(), tr.Span(), b.Tokens, b.Blocks)
}

func TestEmbeddedTrace(t *testing.T) {
	emb, err := EmbeddedTrace(TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if emb.Len() != 600 || emb.Source != EmbeddedTraceName {
		t.Fatalf("embedded trace: %d records from %q", emb.Len(), emb.Source)
	}
	if b := emb.HitBound(0); b.Tokens < 0.6 {
		t.Fatalf("embedded bound %.3f: too little reuse for a demo", b.Tokens)
	}
	full, err := LoadTrace(shippedTracePath(t), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tail := full.Records[full.Len()-600:]
	for i := range tail {
		a, b := emb.Records[i], tail[i]
		a.Line, b.Line = 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("embedded record %d differs from the shipped trace's", i)
		}
	}
}

// FuzzDecodeRecord checks that no line panics the decoder and that every
// accepted record is self-consistent and survives a round trip.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78]}`), 512)
	f.Add([]byte(`{"timestamp":1.5,"input_length":3,"output_length":0,"hash_ids":[18446744073709551615]}`), 2)
	f.Add([]byte(`{"timestamp":0,"input_length":9223372036854775807,"output_length":1,"hash_ids":[1]}`), 512)
	f.Add([]byte(`{"timestamp":null,"input_length":1}`), 512)
	f.Add([]byte(`{}`), 0)
	if data, err := os.ReadFile("traces/mooncake_synthetic_tail600.jsonl"); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for i := 0; i < 3 && sc.Scan(); i++ {
			f.Add([]byte(sc.Text()), 512)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte, blockSize int) {
		r, err := decode(line, blockSize)
		if err != nil {
			return
		}
		n := len(r.HashIDs)
		if r.Timestamp < 0 || r.InputLength <= 0 || r.OutputLength < 0 || n == 0 ||
			(blockSize <= 1<<20 && (r.InputLength > n*blockSize || r.InputLength <= (n-1)*blockSize)) {
			t.Fatalf("accepted inconsistent record %+v at block size %d", r, blockSize)
		}
		again, err := json.Marshal(map[string]any{
			"timestamp": float64(r.Timestamp) / 1e6, "input_length": r.InputLength,
			"output_length": r.OutputLength, "hash_ids": r.HashIDs,
		})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decode(again, blockSize)
		if err != nil {
			t.Fatalf("re-encoded record %s rejected: %v", again, err)
		}
		if r2.InputLength != r.InputLength || r2.OutputLength != r.OutputLength || !reflect.DeepEqual(r2.HashIDs, r.HashIDs) {
			t.Fatalf("round trip changed %+v into %+v", r, r2)
		}
		if d := r2.Timestamp - r.Timestamp; d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("round trip moved timestamp %v to %v", r.Timestamp, r2.Timestamp)
		}
	})
}

// TestLoadTraceFromStdin: "-" reads the trace from the standard input, as
// a pipeline gives it (cat trace.jsonl.gz | kvfast replay --trace -).
func TestLoadTraceFromStdin(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = r
	t.Cleanup(func() { os.Stdin = stdin; r.Close() })
	go func() {
		_, _ = io.WriteString(w, `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[9]}`+"\n")
		w.Close()
	}()
	tr, err := LoadTrace("-", TraceOptions{})
	if err != nil || tr.Len() != 1 || tr.Records[0].HashIDs[0] != 9 {
		t.Fatalf("trace %+v, error %v; want the one record written to the standard input", tr, err)
	}
}
