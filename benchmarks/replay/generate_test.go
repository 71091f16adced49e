package replay

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestGeneratedTracesAreDeterministicAndDifferInReuse(t *testing.T) {
	bounds := map[string]float64{}
	for _, name := range GeneratedTraceNames() {
		a, err := Generate(GeneratedTraces[name])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(GeneratedTraces[name])
		if !reflect.DeepEqual(a.Records, b.Records) {
			t.Fatalf("%s: two generations differ", name)
		}
		// Written out as Mooncake JSONL and read back, it validates and
		// keeps its records.
		var buf bytes.Buffer
		for i := range a.Records {
			r := &a.Records[i]
			ts, in, out := float64(r.Timestamp)/float64(time.Millisecond), wholeNumber(r.InputLength), wholeNumber(r.OutputLength)
			ids := make([]hashID, len(r.HashIDs))
			for j, h := range r.HashIDs {
				ids[j] = hashID(h)
			}
			line, err := json.Marshal(wireRecord{Timestamp: &ts, InputLength: &in, OutputLength: &out, HashIDs: ids})
			if err != nil {
				t.Fatal(err)
			}
			buf.Write(append(line, '\n'))
		}
		back, err := ReadTrace(&buf, name, TraceOptions{})
		if err != nil {
			t.Fatalf("%s does not read back: %v", name, err)
		}
		if !reflect.DeepEqual(back.Records, a.Records) {
			t.Fatalf("%s reads back different records", name)
		}
		bounds[name] = a.HitBound(0).Tokens
	}
	if !(bounds["low"] > 0.2 && bounds["low"] < 0.5 && bounds["high"] > 0.75) {
		t.Fatalf("bounds %v: want low reuse in (0.2, 0.5) and high above 0.75", bounds)
	}
	if _, err := Generate(GenConfig{Name: "bad"}); err == nil {
		t.Fatal("generated a trace from an empty config")
	}
}
