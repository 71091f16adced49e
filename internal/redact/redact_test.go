package redact

import (
	"strings"
	"testing"
)

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000":                  "http://127.0.0.1:8000",
		"127.0.0.1:8000":                         "127.0.0.1:8000",
		"http://ops:HUNTER2@127.0.0.1:8000":      "http://REDACTED@127.0.0.1:8000",
		"http://127.0.0.1:8000/?api_key=HUNTER2": "http://127.0.0.1:8000/?REDACTED",
		"http://127.0.0.1:8000/#HUNTER2":         "http://127.0.0.1:8000/",
		"u:HUNTER2@127.0.0.1:8000":               "REDACTED@127.0.0.1:8000",
		"user:HUNTER2@127.0.0.1:8000?x=1":        "REDACTED@127.0.0.1:8000?REDACTED",
		"http://ho st:1/?sig=HUNTER2":            "http://ho st:1/?REDACTED",
		"http://a:HUN@TER2@h:1":                  "http://REDACTED@h:1",
		"tcp://u:HUNTER2@10.0.0.1:5557":          "tcp://REDACTED@10.0.0.1:5557",
		"u:HUN,TER2@10.0.0.1:8000":               "REDACTED@10.0.0.1:8000",
		"http://127.0.0.1:8000/?":                "http://127.0.0.1:8000/?REDACTED",
		"%zz:HUNTER2@h:1":                        "REDACTED@h:1",
		// Unescaped '?', '#' or '/' in a password (a review's finds: the
		// parser or the cut at '?' ended the authority before the '@').
		"http://user:HUNTER2?x@127.0.0.1:8000": "http://REDACTED@127.0.0.1:8000",
		"http://user:HUNTER2#x@127.0.0.1:8000": "http://REDACTED@127.0.0.1:8000",
		"http://user:12345678?x@127.0.0.1:1":   "http://REDACTED@127.0.0.1:1",
		"tcp://u:HUNTER2?x@10.0.0.1:5557":      "tcp://REDACTED@10.0.0.1:5557",
		"u:HUNTER2?x@10.0.0.1:8000":            "REDACTED@10.0.0.1:8000",
		"http://u:HUN/TER2?x@h:1":              "http://REDACTED@h:1",
		"ipc:///tmp/s?token=HUNTER2":           "ipc:///tmp/s?REDACTED",
	} {
		got := Endpoint(in)
		if got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, "HUNTER2") || strings.Contains(got, "TER2") || strings.Contains(got, "12345678") {
			t.Errorf("Endpoint(%q) = %q leaks the secret", in, got)
		}
	}
}
