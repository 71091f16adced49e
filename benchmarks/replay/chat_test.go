package replay

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/mocker"
)

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func conversation(t *testing.T, s ChatSynth, r *Record) []chatMessage {
	t.Helper()
	var msgs []chatMessage
	raw := s.normalized().appendMessages(nil, r)
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatalf("cannot decode %s: %v", raw, err)
	}
	return msgs
}

func TestChatVocabulary(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range chatVocab {
		if w == "" || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" || seen[w] {
			t.Fatalf("word %q is empty, not lowercase ASCII, or repeated", w)
		}
		seen[w] = true
	}
}

// TestChatConversation: the system prompt, the earlier exchanges and the
// new user turn come from the hash ids as documented, and are as long as
// PromptLen says.
func TestChatConversation(t *testing.T) {
	s := ChatSynth{TraceBlockSize: 8, BlockWords: 4, Seed: 3}
	text := func(id uint64, n int) string { return string(s.AppendText(nil, id, n)) }
	reply := func(id uint64) string { return string(s.appendReply(nil, id)) }
	for _, tc := range []struct {
		name string
		r    Record
		want []chatMessage
	}{
		{"one hash id: the user turn alone", Record{InputLength: 4, HashIDs: []uint64{7}},
			[]chatMessage{{"user", text(7, 2)}}},
		{"two: a system prompt and the turn", Record{InputLength: 16, HashIDs: []uint64{7, 8}},
			[]chatMessage{{"system", text(7, 4)}, {"user", text(8, 4)}}},
		{"four: two earlier exchanges", Record{InputLength: 25, HashIDs: []uint64{7, 8, 9, 10}},
			[]chatMessage{{"system", text(7, 4)}, {"user", text(8, 4)}, {"assistant", reply(8)},
				{"user", text(9, 4)}, {"assistant", reply(9)}, {"user", text(10, 1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := conversation(t, s, &tc.r)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d messages %v, want %v", len(got), got, tc.want)
			}
			words := 0
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("message %d is %+v, want %+v", i, got[i], tc.want[i])
				}
				words += len(strings.Fields(got[i].Content))
			}
			if w, m := s.PromptLen(&tc.r); w != words || m != len(got) {
				t.Errorf("PromptLen says %d words in %d messages, the conversation has %d in %d", w, m, words, len(got))
			}
		})
	}
	sys2 := ChatSynth{TraceBlockSize: 8, BlockWords: 4, SystemIDs: 2, Seed: 3}
	got := conversation(t, sys2, &Record{InputLength: 24, HashIDs: []uint64{7, 8, 9}})
	if want := []chatMessage{{"system", text(7, 4) + " " + text(8, 4)}, {"user", text(9, 4)}}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("two system hash ids: %+v, want %+v", got, want)
	}
	if a, b := text(7, 4), string(ChatSynth{Seed: 4}.AppendText(nil, 7, 4)); a == b {
		t.Errorf("seeds 3 and 4 made the same text %q", a)
	}
	if a, b := text(7, 4), text(8, 4); a == b {
		t.Errorf("hash ids 7 and 8 made the same text %q", a)
	}
}

// TestChatSharesTracePrefixes: a record that extends another's hash ids
// extends its conversation, the shorter one's partial last turn being a
// prefix of the longer one's turn for the same hash id.
func TestChatSharesTracePrefixes(t *testing.T) {
	s := ChatSynth{TraceBlockSize: 8, BlockWords: 6}
	short := conversation(t, s, &Record{InputLength: 19, HashIDs: []uint64{1, 2, 3}})
	long := conversation(t, s, &Record{InputLength: 40, HashIDs: []uint64{1, 2, 3, 4, 5}})
	last := len(short) - 1
	for i := range last {
		if short[i] != long[i] {
			t.Fatalf("message %d differs: %+v and %+v", i, short[i], long[i])
		}
	}
	if short[last].Role != long[last].Role || !strings.HasPrefix(long[last].Content, short[last].Content) ||
		len(short[last].Content) >= len(long[last].Content) {
		t.Fatalf("the short record's last turn %+v is not a proper prefix of %+v", short[last], long[last])
	}
}

// TestChatReplayAgainstMockEngine replays the start of the embedded trace
// as conversations, one at a time, to a mock engine whose cache holds it
// all: the engine accepts every conversation, and the prefix hits it
// reports come near the trace's infinite-cache bound, which counts hash
// ids rather than the template's tokens.
func TestChatReplayAgainstMockEngine(t *testing.T) {
	tr, err := EmbeddedTrace(TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := mocker.Start(mocker.Config{Speedup: math.Inf(1), BlockSize: 4, KVBlocks: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	res, err := Run(context.Background(), Config{RouterURL: e.URL(), Trace: tr, MaxRequests: 120, Concurrency: 1,
		Workload: WorkloadChat, Chat: ChatSynth{BlockWords: 16}, MaxOutputTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary()
	if s.Errors > 0 || s.UsageReports != 120 {
		t.Fatalf("%d errors (%v), %d usage reports", s.Errors, s.ErrorSamples, s.UsageReports)
	}
	if res.Workload != WorkloadChat || res.BlockTokens != 16 {
		t.Errorf("result says workload %q, %d per hash id", res.Workload, res.BlockTokens)
	}
	if f := s.HitFractionOfBound(); f < 0.9 || f > 1.1 {
		t.Errorf("hit rate %.3f against the bound %.3f: %.2f of it, want about all", s.HitRate, s.Bound.Tokens, f)
	}
}
