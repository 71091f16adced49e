package configerr

import "fmt"

type configError struct {
	msg  string
	kind error
}

func (e *configError) Error() string { return e.msg }
func (e *configError) Unwrap() error { return e.kind }

// New returns an error whose text is the formatted message alone and
// which matches kind.
func New(kind error, format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...), kind: kind}
}
