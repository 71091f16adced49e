package epp_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// fakeAPIServer answers the two GETs Kube makes, for one pool, and checks
// the bearer token.
type fakeAPIServer struct {
	t     *testing.T
	token string
	mu    sync.Mutex
	pool  string // the InferencePool's JSON
	pods  string // the pod list's JSON
	sel   string // the label selector the last pod list asked for
	calls atomic.Int64
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools/qwen":
		_, _ = w.Write([]byte(f.pool))
	case "/api/v1/namespaces/llm/pods":
		f.sel = r.URL.Query().Get("labelSelector")
		_, _ = w.Write([]byte(f.pods))
	default:
		http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
	}
}

func startFakeAPIServer(t *testing.T) (*fakeAPIServer, string) {
	f := &fakeAPIServer{t: t, token: "sekret",
		pool: `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"qwen","namespace":"llm"},
			"spec":{"selector":{"matchLabels":{"app":"vllm","model":"qwen"}},"targetPorts":[{"number":8000}],
			"endpointPickerRef":{"name":"kvfast-epp","portNumber":9002}}}`}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return f, "http://" + ln.Addr().String()
}

func pod(name, ip string, ready bool, deleting bool) string {
	status := "False"
	if ready {
		status = "True"
	}
	del := ""
	if deleting {
		del = `,"deletionTimestamp":"2026-12-01T00:00:00Z"`
	}
	return `{"metadata":{"name":"` + name + `"` + del + `},"status":{"podIP":"` + ip + `","conditions":[{"type":"Ready","status":"` + status + `"}]}}`
}

// TestKubeSource: the pool's selector and target port choose the pods;
// pods not ready, being deleted or without an IP are left out; every pod
// gets its event and replay sockets on the configured ports; the token is
// read from its file at every poll (projected tokens rotate).
func TestKubeSource(t *testing.T) {
	f, url := startFakeAPIServer(t)
	f.pods = `{"kind":"PodList","items":[` + strings.Join([]string{
		pod("vllm-0", "10.1.0.5", true, false),
		pod("vllm-1", "10.1.0.6", false, false),
		pod("vllm-2", "10.1.0.7", true, true),
		pod("vllm-3", "", true, false),
		pod("vllm-4", "10.1.0.9", true, false),
	}, ",") + `]}`
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("sekret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := &epp.Kube{APIServer: url, TokenFile: tokenFile, Namespace: "llm", Pool: "qwen", EventsPort: 5557, ReplayPort: 5558}
	eps, err := k.Endpoints(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []epp.Endpoint{
		{Address: "10.1.0.5:8000", Events: "tcp://10.1.0.5:5557", Replay: "tcp://10.1.0.5:5558", Name: "vllm-0"},
		{Address: "10.1.0.9:8000", Events: "tcp://10.1.0.9:5557", Replay: "tcp://10.1.0.9:5558", Name: "vllm-4"},
	}
	if !slices.Equal(eps, want) {
		t.Fatalf("endpoints %+v, want %+v", eps, want)
	}
	if f.sel != "app=vllm,model=qwen" {
		t.Fatalf("label selector %q", f.sel)
	}
	if err := os.WriteFile(tokenFile, []byte("rotated"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Endpoints(context.Background()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("with a token the API server refuses: %v, want its 401", err)
	}
	k.Pool = "missing"
	f.token = "rotated"
	if _, err := k.Endpoints(context.Background()); err == nil {
		t.Fatal("a missing pool listed endpoints")
	}
}

// TestKubeSourceTargetPorts: every target port of the pool is an endpoint
// of its own (a data-parallel rank's server), whose events are on the
// events and replay ports offset by its place in the list, as vLLM offsets
// its sockets by the rank; a pool listing more ports than its CRD allows,
// or a number that is no port, is refused, not cut short.
func TestKubeSourceTargetPorts(t *testing.T) {
	f, url := startFakeAPIServer(t)
	f.token = ""
	f.pool = `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000},{"number":8001}]}}`
	f.pods = `{"kind":"PodList","items":[` + pod("vllm-0", "10.1.0.5", true, false) + `]}`
	k := &epp.Kube{APIServer: url, Namespace: "llm", Pool: "qwen", EventsPort: 5557, ReplayPort: 5600}
	eps, err := k.Endpoints(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []epp.Endpoint{
		{Address: "10.1.0.5:8000", Events: "tcp://10.1.0.5:5557", Replay: "tcp://10.1.0.5:5600", Name: "vllm-0:8000"},
		{Address: "10.1.0.5:8001", Events: "tcp://10.1.0.5:5558", Replay: "tcp://10.1.0.5:5601", Name: "vllm-0:8001"},
	}
	if !slices.Equal(eps, want) {
		t.Fatalf("endpoints %+v, want %+v", eps, want)
	}
	for pool, why := range map[string]string{
		`{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":1},{"number":2},{"number":3},{"number":4},{"number":5},{"number":6},{"number":7},{"number":8},{"number":9}]}}`: "9 target ports",
		`{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":70000}]}}`:                                                                                                     "target port 70000",
	} {
		f.mu.Lock()
		f.pool = pool
		f.mu.Unlock()
		if _, err := k.Endpoints(context.Background()); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v; want an error naming %q", pool, err, why)
		}
	}
	f.mu.Lock()
	f.pool = `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000},{"number":8001}]}}`
	f.mu.Unlock()
	k.EventsPort = 65535
	if _, err := k.Endpoints(context.Background()); err == nil || !strings.Contains(err.Error(), "past port 65535") {
		t.Errorf("the second port's events past 65535: %v", err)
	}
}

// TestRunFollowsSource: Run syncs the picker with the source as pods come
// and go; a failed poll keeps the last endpoints; an endpoint that leaves
// loses its slot and its blocks, and a newcomer may take the slot.
func TestRunFollowsSource(t *testing.T) {
	f, url := startFakeAPIServer(t)
	f.token = ""
	setPods := func(p ...string) {
		f.mu.Lock()
		f.pods = `{"items":[` + strings.Join(p, ",") + `]}`
		f.mu.Unlock()
	}
	setPods(pod("a", "10.2.0.1", true, false), pod("b", "10.2.0.2", true, false))
	r := startEPP(t, epp.DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.picker.Run(ctx, &epp.Kube{APIServer: url, Namespace: "llm", Pool: "qwen"}, time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-r.picker.Ready()
	waitFor(t, "both pods", func() bool { return r.picker.Endpoints() == 2 })
	slotA, _ := r.picker.SlotOf("10.2.0.1:8000")
	prompt := tokens(1, 3*radix.DefaultBlockSize)
	cache(t, r, "10.2.0.1:8000", prompt, 3)

	f.mu.Lock()
	f.pool = "{" // the API server answers garbage for a while
	f.mu.Unlock()
	calls := f.calls.Load()
	waitFor(t, "failed polls", func() bool { return f.calls.Load() > calls+3 })
	if r.picker.Endpoints() != 2 {
		t.Fatalf("a failed poll changed the endpoints: %d", r.picker.Endpoints())
	}
	f.mu.Lock()
	f.pool = `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000}]}}`
	f.mu.Unlock()
	setPods(pod("b", "10.2.0.2", true, false), pod("c", "10.2.0.3", true, false))
	waitFor(t, "a to leave and c to join", func() bool {
		_, a := r.picker.SlotOf("10.2.0.1:8000")
		_, c := r.picker.SlotOf("10.2.0.3:8000")
		return !a && c
	})
	slotC, _ := r.picker.SlotOf("10.2.0.3:8000")
	if slotC != slotA {
		t.Fatalf("the newcomer took slot %d, want the freed slot %d", slotC, slotA)
	}
	var ov workers.Overlaps
	r.picker.Index().FindMatches(radix.AppendBlockHashes(nil, radix.NamespaceSeed(testModel, "", ""), prompt, radix.DefaultBlockSize), &ov)
	if ov[slotC] != 0 {
		t.Fatalf("the newcomer inherited %d blocks of the endpoint that left", ov[slotC])
	}
}

func TestParseEndpoint(t *testing.T) {
	got, err := epp.ParseEndpoint("http://10.0.0.1:8000,zmq=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5558")
	if want := (epp.Endpoint{Address: "10.0.0.1:8000", Events: "tcp://10.0.0.1:5557", Replay: "tcp://10.0.0.1:5558"}); err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	for value, want := range map[string]string{
		"10.0.0.1:8000,colour=red": "the key of item 2",
		"10.0.0.1:8000,zmq=tcp://10.0.0.1:5557,events=tcp://10.0.0.1:5558": "events= repeats zmq=",
		"10.0.0.1:8000,zmq=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5557": "not its zmq= event socket",
		"10.0.0.1:8000,zmq=tcp://*:5557":                                   "wildcard",
	} {
		if _, err := epp.ParseEndpoint(value); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error about %q", value, err, want)
		}
	}
}
