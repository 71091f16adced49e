package replay

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestImageSet: images are drawn with Zipf popularity, in about TurnRate
// of the turns, the same for the same hash id and seed.
func TestImageSet(t *testing.T) {
	set, err := NewImageSet(ImageSynth{Images: 100, Exponent: 1, TurnRate: 0.5, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 100)
	const turns = 200000
	withImage := 0
	for id := range uint64(turns) {
		k, ok := set.Image(id)
		if k2, ok2 := set.Image(id); k2 != k || ok2 != ok {
			t.Fatalf("hash id %d: image %d, %v then %d, %v", id, k, ok, k2, ok2)
		}
		if ok {
			withImage++
			counts[k]++
		}
	}
	if f := float64(withImage) / turns; math.Abs(f-0.5) > 0.01 {
		t.Errorf("%.3f of turns carry an image, want 0.5", f)
	}
	// Zipf at exponent 1: rank 1 (0 here) is drawn twice as often as
	// rank 2 and ten times as often as rank 10.
	for _, tc := range []struct {
		rank int
		want float64
	}{{1, 2}, {9, 10}} {
		if r := float64(counts[0]) / float64(counts[tc.rank]); math.Abs(r-tc.want)/tc.want > 0.1 {
			t.Errorf("rank 0 drawn %.2fx as often as rank %d, want %gx", r, tc.rank, tc.want)
		}
	}
	other, _ := NewImageSet(ImageSynth{Images: 100, Exponent: 1, TurnRate: 0.5, Seed: 8})
	same := 0
	for id := range uint64(1000) {
		k, ok := set.Image(id)
		k2, ok2 := other.Image(id)
		if k == k2 && ok == ok2 {
			same++
		}
	}
	if same > 700 {
		t.Errorf("another seed draws the same %d of 1000 turns' images", same)
	}
	for _, bad := range []ImageSynth{{Images: -1}, {Exponent: -1}, {TurnRate: 1.5}, {TurnRate: math.NaN()}, {Exponent: math.Inf(1)}} {
		if _, err := NewImageSet(bad); err == nil {
			t.Errorf("%+v compiles", bad)
		}
	}
	if d, err := NewImageSet(ImageSynth{}); err != nil || d.Synth() != (ImageSynth{Images: DefaultImages, Exponent: DefaultImageExponent, TurnRate: DefaultImageTurnRate}) {
		t.Errorf("the defaults: %+v, %v", d.Synth(), err)
	}
}

type mmPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

type mmMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// TestChatImages: a user turn with an image is an image_url part and the
// turn's text; the system prompt and the replies never carry one; two
// records sharing hash ids share their images; AppendImages lists them.
func TestChatImages(t *testing.T) {
	set, err := NewImageSet(ImageSynth{TurnRate: 1, Images: 4})
	if err != nil {
		t.Fatal(err)
	}
	s := ChatSynth{TraceBlockSize: 8, BlockWords: 3, Seed: 1, Images: set}
	r := &Record{InputLength: 32, HashIDs: []uint64{1, 2, 3, 4}}
	var msgs []mmMessage
	raw := s.normalized().appendMessages(nil, r)
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatalf("cannot decode %s: %v", raw, err)
	}
	if len(msgs) != 6 {
		t.Fatalf("%d messages: %s", len(msgs), raw)
	}
	images := set.AppendImages(nil, s, r)
	if len(images) != 3 {
		t.Fatalf("images %v, want one per user turn", images)
	}
	user := 0
	for i, m := range msgs {
		if m.Role != "user" {
			if m.Content[0] != '"' {
				t.Errorf("message %d (%s) is not text: %s", i, m.Role, m.Content)
			}
			continue
		}
		var parts []mmPart
		if err := json.Unmarshal(m.Content, &parts); err != nil || len(parts) != 2 || parts[0].Type != "image_url" || parts[1].Type != "text" {
			t.Fatalf("user message %d: %s (%v)", i, m.Content, err)
		}
		id := r.HashIDs[1+user]
		wantWords := 3
		if user == 2 {
			wantWords = s.lastWords(r)
		}
		if want := string(s.AppendText(nil, id, wantWords)); parts[1].Text != want {
			t.Errorf("user message %d text %q, want %q", i, parts[1].Text, want)
		}
		k, _ := set.Image(id)
		if k != images[user] || !strings.HasPrefix(parts[0].ImageURL.URL, imageURLPrefix) ||
			parts[0].ImageURL.URL != imageURLPrefix+string(rune('0'+k))+".png" {
			t.Errorf("user message %d image %q, want rank %d", i, parts[0].ImageURL.URL, images[user])
		}
		user++
	}
	// A follow-up extends the conversation: its body starts with this
	// one's earlier turns, images included.
	follow := &Record{InputLength: 40, HashIDs: []uint64{1, 2, 3, 4, 5}}
	a, b := string(s.appendMessages(nil, r)), string(s.appendMessages(nil, follow))
	cut := strings.LastIndex(a, `{"role":"user"`)
	if !strings.HasPrefix(b, a[:cut]) {
		t.Errorf("the follow-up does not share the earlier turns:\n%s\n%s", a, b)
	}
	// Without Images, the same record is the chat workload's.
	plain := ChatSynth{TraceBlockSize: 8, BlockWords: 3, Seed: 1}
	if strings.Contains(string(plain.normalized().appendMessages(nil, r)), "image_url") {
		t.Error("the chat workload sends images")
	}
}
