package dispatch_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvfast/kvfast/dispatch"
)

// TestEngineHTTPClient: the router's own calls to engines go straight to
// them, whatever HTTP_PROXY says (a proxy would be handed the engines'
// key, and a health judged through it would be the proxy's), and a
// redirect is the engine's answer, not followed.
func TestEngineHTTPClient(t *testing.T) {
	c := dispatch.EngineHTTPClient(time.Second)
	tr, ok := c.Transport.(*http.Transport)
	if !ok || tr.Proxy != nil {
		t.Fatalf("transport %T with a proxy function: calls to engines would follow HTTP_PROXY", c.Transport)
	}
	if c.Timeout != time.Second {
		t.Errorf("timeout %v", c.Timeout)
	}
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a redirect was followed, with Authorization %q", r.Header.Get("Authorization"))
	}))
	defer elsewhere.Close()
	engine := httptest.NewServer(http.RedirectHandler(elsewhere.URL, http.StatusFound))
	defer engine.Close()
	req, err := http.NewRequest(http.MethodGet, engine.URL+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer engine-key")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Errorf("status %d, want the engine's 302", resp.StatusCode)
	}
}
