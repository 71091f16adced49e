package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// DefaultTraceBlockSize is the number of tokens one hash id stands for in a
// Mooncake trace.
const DefaultTraceBlockSize = 512

// maxTimestampMillis keeps a timestamp inside time.Duration's range
// (about 292 years; scaling by a speed-up is clamped, scaleDuration) while
// taking Unix-epoch milliseconds, which some traces carry (replays start
// at the first record's time): 4e12 ms is the year 2096.
const maxTimestampMillis = 4e12

// maxLineBytes bounds one trace line. The longest Mooncake records are a few
// kilobytes; a megabyte-sized line is a corrupt file, not a long prompt.
const maxLineBytes = 16 << 20

var (
	// ErrBadRecord is wrapped by every error about one record's content.
	ErrBadRecord = errors.New("kvfast: bad trace record")
	// ErrEmptyTrace is returned for a trace without a single record.
	ErrEmptyTrace = errors.New("kvfast: trace has no records")
)

// RecordError locates a bad record. errors.Is(err, ErrBadRecord) holds for
// every RecordError.
type RecordError struct {
	Source string // file name, or the name given to ReadTrace
	Line   int    // 1-based
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("cannot decode trace record at %s:%d: %v", e.Source, e.Line, e.Err)
}

func (e *RecordError) Unwrap() []error { return []error{ErrBadRecord, e.Err} }

// Record is one request of a trace.
type Record struct {
	// Timestamp is the arrival time relative to the trace's clock origin.
	Timestamp time.Duration
	// InputLength is the prompt length in tokens at the trace's block size.
	InputLength int
	// OutputLength is the number of tokens to generate.
	OutputLength int
	// HashIDs names the prompt's blocks in order; equal ids at equal
	// positions after equal prefixes mean equal content.
	HashIDs []uint64
	// Line is the record's 1-based line in its source, for error messages
	// and for matching results back to the file.
	Line int
}

// lastBlockTokens is how many tokens of the last hash id the prompt uses at
// the trace's block size: the prompt need not end on a block boundary.
func (r *Record) lastBlockTokens(traceBlockSize int) int {
	return r.InputLength - (len(r.HashIDs)-1)*traceBlockSize
}

// wireRecord mirrors the JSON line. Pointers tell a missing field from a
// zero one; unknown fields are ignored so that richer traces still load.
type wireRecord struct {
	Timestamp    *float64     `json:"timestamp"`
	InputLength  *wholeNumber `json:"input_length"`
	OutputLength *wholeNumber `json:"output_length"`
	HashIDs      []hashID     `json:"hash_ids"`
}

// hashID is one of a record's hash ids: a non-negative integer below
// 2^64. A null (which encoding/json would take for 0, another block's id)
// or a number of another form is refused, naming the field.
type hashID uint64

func (h *hashID) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		if len(b) > 32 {
			b = append(b[:29:29], "..."...)
		}
		return fmt.Errorf("hash_ids holds %s: want non-negative integers below 2^64", b)
	}
	*h = hashID(v)
	return nil
}

// wholeNumber is a length: an integer, written as one or, as Python and
// pandas write a column of numbers, with a zero fraction (512.0).
type wholeNumber int64

func (n *wholeNumber) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return fmt.Errorf("%s is a string, not a number", b)
	}
	var f json.Number
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	if i, err := f.Int64(); err == nil {
		*n = wholeNumber(i)
		return nil
	}
	v, err := f.Float64()
	if err != nil || v != math.Trunc(v) || math.Abs(v) > 1<<53 {
		return fmt.Errorf("%s is not a whole number", b)
	}
	*n = wholeNumber(v)
	return nil
}

// decodeRecord parses one JSONL line of a Mooncake-format trace whose hash
// ids each stand for blockSize tokens. It checks that the record can be
// replayed: the fields are present (the timestamp may be missing if
// untimed, and timed says whether it was there) and in range, and
// hash_ids has exactly the number of blocks input_length needs. Line is
// left zero.
func decodeRecord(line []byte, blockSize int, untimed bool) (rec Record, timed bool, err error) {
	if blockSize <= 0 {
		return Record{}, false, fmt.Errorf("trace block size %d is not positive", blockSize)
	}
	var w wireRecord
	if err := json.Unmarshal(line, &w); err != nil {
		return Record{}, false, err
	}
	switch {
	case w.Timestamp == nil && !untimed:
		return Record{}, false, errors.New("timestamp is missing (only a replay at a fixed concurrency does without)")
	case w.InputLength == nil:
		return Record{}, false, errors.New("input_length is missing")
	case w.OutputLength == nil:
		return Record{}, false, errors.New("output_length is missing")
	case len(w.HashIDs) == 0:
		return Record{}, false, errors.New("hash_ids is missing or empty")
	}
	var ts float64
	if w.Timestamp != nil {
		ts = *w.Timestamp
	}
	in, out := int64(*w.InputLength), int64(*w.OutputLength)
	if !(ts >= 0 && ts <= maxTimestampMillis) {
		return Record{}, false, fmt.Errorf("timestamp %v ms is outside [0, %g]", ts, float64(maxTimestampMillis))
	}
	if in <= 0 {
		return Record{}, false, fmt.Errorf("input_length %d is not positive", in)
	}
	if out < 0 || out > 1<<31-1 {
		return Record{}, false, fmt.Errorf("output_length %d is out of range", out)
	}
	// (in-1)/bs+1 is ceil(in/bs) without the overflow of in+bs-1.
	if need := (in-1)/int64(blockSize) + 1; need != int64(len(w.HashIDs)) {
		return Record{}, false, fmt.Errorf("input_length %d needs %d hash ids, one per block of %d tokens, but hash_ids has %d (is the trace block size right?)",
			in, need, blockSize, len(w.HashIDs))
	}
	ids := make([]uint64, len(w.HashIDs))
	for i, h := range w.HashIDs {
		ids[i] = uint64(h)
	}
	return Record{
		Timestamp:    time.Duration(ts * float64(time.Millisecond)),
		InputLength:  int(in),
		OutputLength: int(out),
		HashIDs:      ids,
	}, w.Timestamp != nil, nil
}

// TraceOptions say how to read a trace.
type TraceOptions struct {
	// BlockSize is the number of tokens per hash id; 0 means
	// DefaultTraceBlockSize.
	BlockSize int
	// MaxRecords stops reading after this many records; 0 reads all.
	MaxRecords int
	// Untimed accepts records without a timestamp, for a replay that
	// ignores arrival times (Config.Concurrency): such a record takes the
	// timestamp of the record before it, so it keeps its place in the file.
	Untimed bool
}

// Trace is a loaded trace, ordered by arrival time. It is immutable after
// loading and safe for concurrent use.
type Trace struct {
	Source    string
	BlockSize int // tokens per hash id
	Records   []Record

	analysis *prefixAnalysis // shared with traces made by Head
}

// LoadTrace reads a Mooncake-format JSONL file, or the standard input
// for "-".
func LoadTrace(path string, opts TraceOptions) (*Trace, error) {
	if path == "-" {
		return ReadTrace(os.Stdin, "stdin", opts)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open trace %s: %w", path, err)
	}
	defer f.Close()
	return ReadTrace(f, path, opts)
}

//go:embed traces/mooncake_synthetic_tail600.jsonl
var embeddedTrace []byte

// EmbeddedTraceName is the Source of the trace EmbeddedTrace returns.
const EmbeddedTraceName = "embedded:mooncake_synthetic_tail600.jsonl"

// EmbeddedTrace returns the last 600 records of the shipped Mooncake
// synthetic trace, compiled into the binary so that the demo runs anywhere.
// The tail is used rather than the head because the trace's reuse builds up
// over time: the first 600 records have an infinite-cache bound of 0.11,
// the last 600 (replayed cold) 0.68, close to the full trace's.
func EmbeddedTrace(opts TraceOptions) (*Trace, error) {
	return ReadTrace(bytes.NewReader(embeddedTrace), EmbeddedTraceName, opts)
}

// ReadTrace reads a Mooncake-format JSONL stream; source names it in error
// messages. A gzip-compressed stream is decompressed and a leading UTF-8
// byte order mark skipped. Blank lines are skipped. Records are stably
// sorted by timestamp, so a trace that is out of order replays in arrival
// order.
func ReadTrace(r io.Reader, source string, opts TraceOptions) (*Trace, error) {
	bs := opts.BlockSize
	if bs == 0 {
		bs = DefaultTraceBlockSize
	}
	if bs < 0 {
		return nil, fmt.Errorf("cannot read trace %s: block size %d is negative", source, bs)
	}
	r, err := plainTrace(r)
	if err != nil {
		return nil, fmt.Errorf("cannot read trace %s: %w", source, err)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	t := &Trace{Source: source, BlockSize: bs}
	line := 0
	var last time.Duration // the latest timestamp read, for untimed records
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		rec, timed, err := decodeRecord(text, bs, opts.Untimed)
		if err != nil {
			// The scanner hands over what it read of the last line before
			// it reports a read error (a gzip stream cut short): that
			// error, not the half line's JSON, is what is wrong.
			if !sc.Scan() && sc.Err() != nil && !errors.Is(sc.Err(), bufio.ErrTooLong) {
				return nil, fmt.Errorf("cannot read trace %s after line %d: %w", source, line-1, sc.Err())
			}
			return nil, &RecordError{Source: source, Line: line, Err: err}
		}
		if !timed {
			rec.Timestamp = last
		}
		last = rec.Timestamp
		rec.Line = line
		t.Records = append(t.Records, rec)
		if opts.MaxRecords > 0 && len(t.Records) == opts.MaxRecords {
			break
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &RecordError{Source: source, Line: line + 1, Err: fmt.Errorf("line is longer than %d bytes", maxLineBytes)}
		}
		return nil, fmt.Errorf("cannot read trace %s: %w", source, err)
	}
	if len(t.Records) == 0 {
		return nil, fmt.Errorf("cannot read trace %s: %w", source, ErrEmptyTrace)
	}
	cmp := func(a, b Record) int {
		switch {
		case a.Timestamp < b.Timestamp:
			return -1
		case a.Timestamp > b.Timestamp:
			return 1
		}
		return 0
	}
	if !slices.IsSortedFunc(t.Records, cmp) {
		slices.SortStableFunc(t.Records, cmp)
	}
	t.analysis = &prefixAnalysis{records: t.Records}
	return t, nil
}

// plainTrace undoes what tools commonly do to a JSONL file on its way
// here: traces are shared gzipped (the line bound still applies to the
// decompressed lines), and Windows editors and PowerShell start UTF-8
// files with a byte order mark, which JSON does not allow.
func plainTrace(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("cannot decompress the gzip stream: %w", err)
		}
		br = bufio.NewReader(zr)
	}
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte("\xef\xbb\xbf")) {
		_, _ = br.Discard(3)
	}
	return br, nil
}

func (t *Trace) blockSize() int {
	if t.BlockSize <= 0 {
		return DefaultTraceBlockSize
	}
	return t.BlockSize
}

// Len returns the number of records.
func (t *Trace) Len() int { return len(t.Records) }

// Head returns a trace of the first n records (all of them if n <= 0 or n
// is larger than the trace). It shares memory with t. Because a record's
// cache hits depend only on the records before it, the head's bound is
// exactly what replaying only the head can achieve.
func (t *Trace) Head(n int) *Trace {
	if n <= 0 || n >= len(t.Records) {
		return t
	}
	h := *t
	h.Records = t.Records[:n:n]
	return &h
}

// Span returns the time from the first arrival to the last.
func (t *Trace) Span() time.Duration {
	if len(t.Records) == 0 {
		return 0
	}
	return t.Records[len(t.Records)-1].Timestamp - t.Records[0].Timestamp
}

// prefixAnalysis caches, per record, how much of it repeats a prefix
// chain seen in an earlier record (prefixHit). It is computed once for the root
// trace; heads reuse it, since record i's value depends only on records
// before i.
type prefixAnalysis struct {
	records []Record // the root trace's, in arrival order
	once    sync.Once
	hits    []prefixHit
}
