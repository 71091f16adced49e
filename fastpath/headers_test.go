package fastpath

import (
	"net/textproto"
	"testing"
)

// setDecisionHeaders hands these names to fasthttp's SetCanonical, which
// trusts them to be canonical already.
func TestDecisionHeaderKeysAreCanonical(t *testing.T) {
	for _, k := range [][]byte{headerWorkerKey, headerDPRankKey, headerOverlapBlocksKey, headerRequestIDKey} {
		if c := textproto.CanonicalMIMEHeaderKey(string(k)); c != string(k) {
			t.Errorf("header name %q is not canonical (%q)", k, c)
		}
	}
}
