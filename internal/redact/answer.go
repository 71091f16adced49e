package redact

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/valyala/fasthttp"
)

// AnswerError is err, a failure to read an engine's HTTP answer, told
// without the answer's bytes: fasthttp quotes what it cannot parse (a
// status line, a header value, the buffered block), even with
// SecureErrorLogMessage in places, and an engine that echoes its request
// there would put the engines' key and a client's prompt into the log.
// Failures that carry no bytes keep their text: the connection's
// (timeouts, EOF, a reset), a header block too large, and those in keep.
// Any other says only that the answer was not HTTP the router can read.
// What err wraps is kept, so that errors.Is and errors.As still see it.
func AnswerError(err error, keep ...error) error {
	if err == nil {
		return nil
	}
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &ne), errors.As(err, &small), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, fasthttp.ErrTimeout),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, fasthttp.ErrBodyTooLarge):
		return err
	}
	for _, k := range keep {
		if errors.Is(err, k) {
			return err
		}
	}
	return &answerHidden{err: err}
}

// answerHidden is an unreadable answer's error, without its bytes.
type answerHidden struct{ err error }

func (e *answerHidden) Error() string {
	return "the engine's answer is not HTTP the router can read (its bytes are not shown, as an engine may echo the request)"
}

func (e *answerHidden) Unwrap() error { return e.err }
