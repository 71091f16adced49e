package prompt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

var testMediaLimits = MediaLimits{MaxItems: 4, MaxItemBytes: 1 << 10}

func dataURL(mime string, b []byte) string {
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func parseMedia(t *testing.T, messages string, lim MediaLimits) (*Media, error) {
	t.Helper()
	var m Media
	if err := m.Parse([]byte(messages), lim); err != nil {
		return &m, err
	}
	return &m, nil
}

func TestMediaItems(t *testing.T) {
	pixels := []byte(strings.Repeat("rgb", 300))
	// The same bytes under another media type, and with base64's '/'
	// escaped as JSON allows, are the same item.
	png := dataURL("image/png", pixels)
	jpeg := strings.ReplaceAll(dataURL("image/jpeg", pixels), "/", `\/`)
	audio := base64.StdEncoding.EncodeToString([]byte("pcm"))
	msgs := `[{"role":"system","content":"look"},
		{"role":"user","content":[{"type":"text","text":"what is"},
			{"type":"image_url","image_url":{"url":"` + png + `","detail":"low"}},
			{"image_url":{"url":"` + jpeg + `"},"type":"image_url"},
			{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}},
			{"type":"input_audio","input_audio":{"data":"` + audio + `","format":"wav"}}]}]`
	m, err := parseMedia(t, msgs, testMediaLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Items) != 4 {
		t.Fatalf("%d items, want 4: %+v", len(m.Items), m.Items)
	}
	a, b, u, au := m.Items[0], m.Items[1], m.Items[2], m.Items[3]
	if a.ID != b.ID || !a.Inline || a.Bytes != len(pixels) {
		t.Errorf("the same pixels are two items: %+v %+v", a, b)
	}
	if u.ID == a.ID || u.Inline || u.Bytes != len("https://example.com/cat.png") {
		t.Errorf("a URL item: %+v", u)
	}
	if au.Kind != MediaAudio || !au.Inline || au.Bytes != 3 {
		t.Errorf("input_audio item: %+v", au)
	}
	if a.Kind != MediaImage || !strings.Contains(string(a.Part), `"detail":"low"`) {
		t.Errorf("the part is not the client's: %s", a.Part)
	}
	// Other pixels are another item; a video is its own kind.
	m2, err := parseMedia(t, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+dataURL("image/png", pixels[1:])+`"}},
		{"type":"video_url","video_url":{"url":"https://example.com/v.mp4"}}, {"type":"image_url","image_url":{"url":""}}]}]`, testMediaLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Items) != 2 || m2.Items[0].ID == a.ID || m2.Items[1].Kind != MediaVideo {
		t.Errorf("items %+v", m2.Items)
	}
	// Base64 wrapped at 76 columns, as MIME encoders write it, is the same
	// item as unwrapped, however long.
	big := make([]byte, 9000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	flat := base64.StdEncoding.EncodeToString(big)
	var wrapped strings.Builder
	for rest := flat; len(rest) > 0; rest = rest[min(len(rest), 76):] {
		wrapped.WriteString(rest[:min(len(rest), 76)] + `\r\n`)
	}
	wide := MediaLimits{MaxItems: 4, MaxItemBytes: 1 << 20}
	m4, err := parseMedia(t, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+flat+`"}},
		{"type":"image_url","image_url":{"url":"data:image/png;base64,`+wrapped.String()+`"}}]}]`, wide)
	if err != nil {
		t.Fatal(err)
	}
	if len(m4.Items) != 2 || m4.Items[0].ID != m4.Items[1].ID || m4.Items[1].Bytes != len(big) {
		for i, it := range m4.Items {
			t.Logf("item %d: id %x, %d bytes", i, it.ID, it.Bytes)
		}
		t.Errorf("wrapped and unwrapped base64 of %d bytes are not one item", len(big))
	}
	// A repeated "type" is the last one's, as the engine's JSON decoder
	// reads it.
	m5, err := parseMedia(t, `[{"role":"user","content":[{"type":"text","type":"image_url","image_url":{"url":"https://example.com/a.png"}},
		{"type":"image_url","type":"text","text":"x","image_url":{"url":"https://example.com/b.png"}}]}]`, testMediaLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(m5.Items) != 1 || !strings.Contains(string(m5.Items[0].Part), "a.png") {
		t.Errorf("parts with a repeated type: %d items, want the first part's", len(m5.Items))
	}
	// Text-only prompts have none.
	if m3, err := parseMedia(t, `[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"x"}]}]`, testMediaLimits); err != nil || len(m3.Items) != 0 {
		t.Errorf("text prompt: %+v, %v", m3.Items, err)
	}
}

func TestMediaLimits(t *testing.T) {
	img := `{"type":"image_url","image_url":{"url":"https://example.com/x.png"}}`
	five := `[{"role":"user","content":[` + strings.Repeat(img+",", 4) + img + `]}]`
	if _, err := parseMedia(t, five, testMediaLimits); err != ErrTooManyMedia {
		t.Errorf("five items under a limit of four: %v", err)
	}
	big := dataURL("image/png", make([]byte, 2<<10))
	if _, err := parseMedia(t, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+big+`"}}]}]`, testMediaLimits); err != ErrMediaTooLarge {
		t.Errorf("a 2 KiB image under a 1 KiB limit: %v", err)
	}
	if ErrMediaTooLarge.Status != 413 || ErrTooManyMedia.Status != 400 {
		t.Error("the refusals are not client errors")
	}
	longURL := `https://example.com/` + strings.Repeat("a", 2<<10)
	if _, err := parseMedia(t, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+longURL+`"}}]}]`, testMediaLimits); err != ErrMediaTooLarge {
		t.Errorf("a 2 KiB URL under a 1 KiB limit: %v", err)
	}
}

// FuzzMedia: whatever messages a client sends, Parse stays within its
// limits, and every item it returns is a content part of the request
// whose type, as encoding/json reads it (the last of a repeated key, as
// the engines' decoders read it), is the item's kind.
func FuzzMedia(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://e.com/a"}}]}]`,
		`[{"role":"user","content":[{"type":"text","type":"image_url","image_url":{"url":"data:image/png;base64,AAAA\r\nAAAA"}}]}]`,
		`[{"content":[{"type":"input_audio","input_audio":{"data":"cGNt","format":"wav"}},{"type":"video_url","video_url":{"url":"x"}}]}]`,
		`[{"content":[{"type":"image_url","type":7,"image_url":{"url":"u"}}]}]`,
	} {
		f.Add([]byte(s))
	}
	kinds := map[string]MediaKind{"image_url": MediaImage, "audio_url": MediaAudio, "input_audio": MediaAudio, "video_url": MediaVideo}
	f.Fuzz(func(t *testing.T, messages []byte) {
		if !json.Valid(messages) {
			return // Parse is given the request's messages, valid JSON
		}
		lim := MediaLimits{MaxItems: 3, MaxItemBytes: 64}
		var m Media
		if err := m.Parse(messages, lim); err != nil {
			if err != ErrTooManyMedia && err != ErrMediaTooLarge {
				t.Fatalf("refusal %v", err)
			}
			return
		}
		if len(m.Items) > lim.MaxItems {
			t.Fatalf("%d items over a limit of %d", len(m.Items), lim.MaxItems)
		}
		for _, it := range m.Items {
			if it.Bytes > lim.MaxItemBytes {
				t.Fatalf("an item of %d bytes over a limit of %d", it.Bytes, lim.MaxItemBytes)
			}
			if !bytes.Contains(messages, it.Part) {
				t.Fatalf("item %q is not part of the request", it.Part)
			}
			var part struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(it.Part, &part); err != nil || kinds[part.Type] != it.Kind {
				t.Fatalf("item %q of kind %v: encoding/json reads type %q (%v)", it.Part, it.Kind, part.Type, err)
			}
		}
	})
}
