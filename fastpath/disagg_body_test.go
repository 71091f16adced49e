package fastpath

import "testing"

func TestTopLevelMember(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"a":1,"kv_transfer_params":{"x":1}}`, `{"x":1}`},
		{`{"kv_transfer_params":null}`, `null`},
		{`{"choices":[{"kv_transfer_params":1}]}`, ``}, // not top-level
		// Given twice, the last value, as vLLM's server (Python's json)
		// reads it.
		{`{"kv_transfer_params":{"x":1},"kv_transfer_params":{"x":2}}`, `{"x":2}`},
		{`[1]`, ``},
	} {
		if got := string(topLevelMember([]byte(tc.body), "kv_transfer_params")); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.body, got, tc.want)
		}
	}
}
