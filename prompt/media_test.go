package prompt

import (
	"encoding/base64"
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
