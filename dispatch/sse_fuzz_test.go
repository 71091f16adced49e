package dispatch

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

// FuzzSSEScan relays arbitrary bytes as an event stream, split into reads at
// arbitrary points, and checks that the client receives exactly the bytes
// sent and that inspection sees the same events as a one-shot scan.
func FuzzSSEScan(f *testing.F) {
	f.Add([]byte(chunk(0, "a", "")+chunk(1, "b", "stop")+"data: [DONE]\n\n"), uint16(7), false)
	f.Add([]byte(": c\r\n\r\nevent: error\ndata: x\n\ndata: {\"error\":{}}\n\n"), uint16(1), true)
	f.Add([]byte("data: {\"choices\":[{\"finish_reason\":\"len\\\"gth\"}]}\n\r\n\n\n"), uint16(300), false)
	f.Add([]byte("data: {\"choices\":[{\"text\":\"\\"), uint16(2), true)
	f.Fuzz(func(t *testing.T, data []byte, seed uint16, small bool) {
		bufSize := 4096
		if small {
			bufSize = 48
		}
		sizes := []int{int(seed%61) + 1, int(seed%7) + 1, int(seed>>8) + 1}
		obs := &itemCounter{}
		c := relayCall(t, bufSize, "text/event-stream", 200, &splitReader{data: data, sizes: sizes}, obs)
		defer c.Release()
		var out bytes.Buffer
		_ = c.Relay(bufio.NewWriterSize(&out, 16))
		// Every whole event is relayed exactly. After them, an input that
		// ends mid-event gets that event completed if it ended the
		// response; else, like a stream that ends without [DONE] or a
		// terminal item, the error event, as an event of its own: after
		// a blank line if part of the cut event was already sent (one too
		// big for the buffer passes through in pieces), else alone.
		got := out.Bytes()
		whole := wholeEvents(data)
		if !bytes.HasPrefix(got, data[:whole]) {
			t.Fatalf("relay changed the stream:\n got %q\nwant %q", got, data)
		}
		rest, tail := got[whole:], data[whole:]
		errEvent := sseErrors[kindOf(ErrTruncated)]
		if errSeen, doneSeen := terminalEvents(data); errSeen && !doneSeen && !bytes.HasSuffix(rest, errEvent) {
			// After the engine's own error event, a stream that ends
			// without [DONE] gets it from the relay.
			rest, _ = bytes.CutSuffix(rest, doneEvent)
		}
		switch {
		case len(rest) == 0 && len(tail) == 0: // a clean end
		case len(tail) > 0 && bytes.Equal(rest, append(bytes.Clone(tail), "\n\n"...)): // the last event completed
		case bytes.HasSuffix(rest, errEvent):
			if sent := rest[:len(rest)-len(errEvent)]; len(sent) > 0 {
				cut, ok := bytes.CutSuffix(sent, []byte("\n\n"))
				if !ok || !bytes.HasPrefix(tail, cut) {
					t.Fatalf("before the error event relay sent %q of the cut event %q", sent, tail)
				}
			}
		default:
			t.Fatalf("after the whole events relay sent %q of %q", rest, tail)
		}

		if !small && len(data) <= bufSize {
			if items := oneShotItems(data); obs.items != items {
				t.Fatalf("relay reported %d items, a one-shot scan %d", obs.items, items)
			}
		}
	})
}

// wholeEvents is the length of b's prefix of complete events.
func wholeEvents(b []byte) int {
	n := 0
	for {
		k, _ := openai.EventEnd(b[n:], 0)
		if k <= 0 {
			return n
		}
		n += k
	}
}

// oneShotItems counts the items an observer is told of: every item up to
// and including the terminal one, none after [DONE] or an error event.
func oneShotItems(b []byte) int {
	items := 0
	for len(b) > 0 {
		n, _ := openai.EventEnd(b, 0)
		if n < 0 {
			n = len(b)
		}
		switch ev := openai.ParseEvent(b[:n]); ev.Kind {
		case openai.EventItem:
			items++
			if ev.FinishReason != nil {
				return items
			}
		case openai.EventDone, openai.EventError:
			return items
		}
		b = b[n:]
	}
	return items
}

// terminalEvents reports whether b holds an error event and a [DONE],
// its last event counted whether or not it ends.
func terminalEvents(b []byte) (errSeen, doneSeen bool) {
	for len(b) > 0 {
		n, _ := openai.EventEnd(b, 0)
		if n < 0 {
			n = len(b)
		}
		switch openai.ParseEvent(b[:n]).Kind {
		case openai.EventError:
			errSeen = true
		case openai.EventDone:
			doneSeen = true
		}
		b = b[n:]
	}
	return errSeen, doneSeen
}

// itemCounter is an Observer that counts the items it is told of.
type itemCounter struct{ items int }

func (o *itemCounter) OnDispatched()     {}
func (o *itemCounter) OnFirstToken()     {}
func (o *itemCounter) OnItem(int)        { o.items++ }
func (o *itemCounter) OnComplete([]byte) {}
func (o *itemCounter) OnAbort(error)     {}
