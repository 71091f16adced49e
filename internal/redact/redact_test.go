package redact

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
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
		// Which the text cannot tell from a query holding an '@': nothing
		// after the scheme is shown.
		"http://user:HUNTER2?x@127.0.0.1:8000": "http://REDACTED",
		"http://user:HUNTER2#x@127.0.0.1:8000": "http://REDACTED",
		"http://user:12345678?x@127.0.0.1:1":   "http://REDACTED",
		"tcp://u:HUNTER2?x@10.0.0.1:5557":      "tcp://REDACTED",
		"u:HUNTER2?x@10.0.0.1:8000":            "REDACTED",
		"http://u:HUN/TER2?x@h:1":              "http://REDACTED",
		"ipc:///tmp/s?token=HUNTER2":           "ipc:///tmp/s?REDACTED",
		// A query or fragment holding an '@' (the diff review's finds).
		"http://h:1/?user=alice@example.com&api_key=HUNTER2": "http://REDACTED",
		"http://h:1/#frag@x&HUNTER2":                         "http://REDACTED",
		"tcp://h:1?k=HUNTER2@x&y":                            "tcp://REDACTED",
		"u:HUNTER2@h:1/?next=http://a@b":                     "REDACTED",
		"http://[::1]:8000/?q=HUNTER2":                       "http://[::1]:8000/?REDACTED",
		"http://u:HUNTER2@[::1]:8000/x":                      "http://REDACTED@[::1]:8000/x",
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

// AnswerError hides whatever an unreadable answer's error quotes, and keeps
// the text of failures that quote nothing, and what the error wraps.
func TestAnswerError(t *testing.T) {
	quoted := fmt.Errorf("error when reading response headers: %w", errors.New(`invalid response status code "/v1/completions": response "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer HUNTER2"`))
	got := AnswerError(quoted)
	if strings.Contains(got.Error(), "HUNTER2") || !errors.Is(got, errors.Unwrap(quoted)) {
		t.Errorf("AnswerError(%v) = %v: want the bytes hidden and the cause kept", quoted, got)
	}
	timeout := errors.New("kvfast: first-byte timeout")
	for _, err := range []error{io.EOF, fmt.Errorf("read: %w", syscall.ECONNRESET), fmt.Errorf("x: %w", timeout)} {
		if got := AnswerError(err, timeout); got != err {
			t.Errorf("AnswerError(%v) = %v: want it unchanged", err, got)
		}
	}
	if AnswerError(nil) != nil {
		t.Error("AnswerError(nil) is not nil")
	}
}
