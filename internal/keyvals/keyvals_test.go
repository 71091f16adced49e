package keyvals

import (
	"slices"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	aliases := map[string]string{"endpoint": "url", "events": "zmq"}
	got, err := Split(" url=http://h:1 ,model=m=n,zmq=", aliases)
	want := []Pair{{"url", "http://h:1"}, {"model", "m=n"}, {"zmq", ""}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	for list, msg := range map[string]string{
		"model=m,model=n":                "model= is given twice",
		"url=http://h:1,endpoint=h:2":    "endpoint= repeats url=, another name for it",
		"events=tcp://h:1,zmq=tcp://h:2": "zmq= repeats events=, another name for it",
		"url=http://h:1,model":           `want key=value pairs separated by commas: item 2 has no '='`,
		"":                               `want key=value pairs separated by commas: item 1 has no '='`,
	} {
		if _, err := Split(list, aliases); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", list, err, msg)
		}
	}
}
