package configerr_test

import (
	"errors"
	"testing"

	"github.com/kvfast/kvfast/internal/configerr"
)

func TestNewMatchesItsKindAndSaysOnlyItsMessage(t *testing.T) {
	kind := errors.New("kvfast: invalid configuration")
	err := configerr.New(kind, "cannot use --x %d: must be positive", -1)
	if !errors.Is(err, kind) || err.Error() != "cannot use --x -1: must be positive" {
		t.Fatalf("%v (matches %v)", err, errors.Is(err, kind))
	}
}
