package openai

import (
	"slices"
	"testing"
)

// FuzzParseEvent splits arbitrary bytes into events, whole and fed a few
// bytes at a time, and classifies each: both splits must agree, and a
// finish_reason must lie inside its event and belong to an item.
func FuzzParseEvent(f *testing.F) {
	f.Add([]byte(chunk(0, "a", "")+chunk(1, "b", "stop")+"data: [DONE]\n\n"), uint8(7))
	f.Add([]byte(": c\r\n\r\nevent: error\ndata: x\n\ndata: {\"error\":{}}\n\n"), uint8(1))
	f.Add([]byte("data: {\"choices\":[{\"finish_reason\":\"len\\\"gth\"}]}\n\r\n\n\n"), uint8(3))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"\\"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		var oneShot, incremental []int
		for b := data; ; {
			n, _ := EventEnd(b, 0)
			if n < 0 {
				break
			}
			oneShot = append(oneShot, n)
			ev := ParseEvent(b[:n])
			if ev.FinishReason != nil && (ev.Kind != EventItem || !within(b[:n], ev.FinishReason)) {
				t.Fatalf("finish reason %q outside its event or on a %v", ev.FinishReason, ev.Kind)
			}
			b = b[n:]
		}
		start, ls := 0, 0
		for end := 0; end < len(data); {
			end = min(end+int(step%16)+1, len(data))
			for {
				n, resume := EventEnd(data[start:end], ls)
				if n < 0 {
					ls = resume
					break
				}
				incremental = append(incremental, n)
				start += n
				ls = 0
			}
		}
		if !slices.Equal(oneShot, incremental) {
			t.Fatalf("one shot %v, incremental %v", oneShot, incremental)
		}
		// The same for a whole body; a partial event is classified too.
		if ev := ParseResponse(data); ev.FinishReason != nil && (ev.Kind != EventItem || !within(data, ev.FinishReason)) {
			t.Fatalf("finish reason %q outside the body or on a %v", ev.FinishReason, ev.Kind)
		}
		if ev := ParseEvent(data); ev.FinishReason != nil && (ev.Kind != EventItem || !within(data, ev.FinishReason)) {
			t.Fatalf("finish reason %q outside the event or on a %v", ev.FinishReason, ev.Kind)
		}
	})
}

func within(outer, inner []byte) bool {
	if len(inner) == 0 {
		return true
	}
	for i := range outer {
		if &outer[i] == &inner[0] {
			return i+len(inner) <= len(outer)
		}
	}
	return false
}
