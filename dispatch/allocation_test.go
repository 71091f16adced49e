//go:build !race

package dispatch

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestRelayAllocations(t *testing.T) {
	stream := []byte(strings.Join(vllmStream(256), ""))
	src := bytes.NewReader(stream)
	var obs Observer = nopObserver{}
	c := relayCall(t, 4096, "text/event-stream", 200, src, obs)
	defer c.Release()
	w := bufio.NewWriter(io.Discard)
	run := func() {
		src.Reset(stream)
		c.obs, c.finished, c.first, c.done, c.open = obs, false, false, false, true
		c.resp.SetBodyStream(src, -1)
		if err := c.Relay(w); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("relaying a stream made %v allocations", n)
	}
}
