package feed

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// libzmqPython finds a Python with pyzmq and msgpack: $KVFAST_PYTHON,
// Debian's /usr/bin/python3 (python3-zmq, python3-msgpack), then python3.
// Missing, the test skips, or fails in CI, where
// scripts/setup-test-deps.sh installs them.
func libzmqPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("KVFAST_PYTHON"), "/usr/bin/python3", "python3"} {
		if p != "" && exec.Command(p, "-c", "import zmq, msgpack").Run() == nil {
			return p
		}
	}
	msg := "Python with pyzmq and msgpack (Debian: python3-zmq, python3-msgpack) is missing; run scripts/setup-test-deps.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestZMQCatchUpFromALibzmqReplaySocket: an engine built as vLLM's
// publisher is, on libzmq, published its whole history before the router
// subscribed. The subscriber catches up from the replay socket at once,
// without a live batch, and gets every batch although libzmq's ROUTER
// drops replies past its send high-water mark (1,000) while the reader is
// behind: replies are read ahead of applying them, and what was dropped
// is asked for again. (Go's zmq4, the other tests' engine, never drops.)
func TestZMQCatchUpFromALibzmqReplaySocket(t *testing.T) {
	python := libzmqPython(t)
	const batches = 10000 // vLLM's default replay buffer
	cmd := exec.Command(python, "-B", "testdata/py_libzmq_replay.py", fmt.Sprint(batches), fmt.Sprint(testBlockSize))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // the publisher exits when its stdin closes
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var pubPort, replayPort int
	if _, err := fmt.Fscan(bufio.NewReader(stdout), &pubPort, &replayPort); err != nil {
		t.Fatalf("the publisher did not say its ports: %v", err)
	}

	ix := newZMQIndex(t)
	s := startSubAt(t, ix, fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		func(c *ZMQConfig) { c.Topic, c.ReplayTimeout = "kv", 10*time.Second })
	deadline := time.Now().Add(time.Minute)
	for st := s.Stats(); st.Batches < batches; st = s.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("caught up %d of %d batches: %+v", st.Batches, batches, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := s.Stats()
	if st.Replayed != batches || st.Resyncs != 0 || st.StoredBlocks != batches {
		t.Fatalf("stats %+v, want all %d batches replayed and stored, no resync", st, batches)
	}
	t.Logf("%d replay requests, %d asked again after a hole", st.Replays, st.ReplayHoles)
	// Every block is the worker's, the last as the first.
	seed := radix.NamespaceSeed(testModel, "", "")
	for _, seq := range []int{0, batches / 2, batches - 1} {
		tokens := make([]uint32, testBlockSize)
		for i := range tokens {
			tokens[i] = uint32(seq*testBlockSize + i)
		}
		var ov workers.Overlaps
		ix.FindMatches(radix.AppendBlockHashes(nil, seed, tokens, testBlockSize), &ov)
		if ov[zmqTestSlot] != 1 {
			t.Errorf("batch %d's block is not the worker's: overlap %d", seq, ov[zmqTestSlot])
		}
	}
}
