package epp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/epp"
)

// fakeLeases is the API server's Lease resource for one namespace, with
// its optimistic concurrency: a write must carry the resourceVersion it
// read.
type fakeLeases struct {
	mu     sync.Mutex
	leases map[string]map[string]any
	rv     int
}

func (f *fakeLeases) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	const prefix = "/apis/coordination.k8s.io/v1/namespaces/llm/leases"
	f.mu.Lock()
	defer f.mu.Unlock()
	name := ""
	if len(r.URL.Path) > len(prefix)+1 {
		name = r.URL.Path[len(prefix)+1:]
	}
	var in map[string]any
	if r.Method != http.MethodGet {
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	meta := func(m map[string]any) map[string]any { return m["metadata"].(map[string]any) }
	switch r.Method {
	case http.MethodGet:
		l, ok := f.leases[name]
		if !ok {
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(l)
		return
	case http.MethodPost:
		name = meta(in)["name"].(string)
		if _, ok := f.leases[name]; ok {
			http.Error(w, `{"kind":"Status","code":409}`, http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	case http.MethodPut:
		cur, ok := f.leases[name]
		if !ok || meta(in)["resourceVersion"] != meta(cur)["resourceVersion"] {
			http.Error(w, `{"kind":"Status","code":409}`, http.StatusConflict)
			return
		}
	}
	f.rv++
	meta(in)["resourceVersion"] = strconv.Itoa(f.rv)
	f.leases[name] = in
	_ = json.NewEncoder(w).Encode(in)
}

func (f *fakeLeases) holder(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[name]
	if !ok {
		return ""
	}
	h, _ := l["spec"].(map[string]any)["holderIdentity"].(string)
	return h
}

// TestElectorActiveStandby: of two replicas exactly one leads; when it
// stops it gives the Lease up and the other takes it at once; a holder
// that vanished without giving it up loses it once its claim has not
// been renewed for the lease duration.
func TestElectorActiveStandby(t *testing.T) {
	f := &fakeLeases{leases: map[string]map[string]any{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-served
	})
	kube := &epp.Kube{APIServer: "http://" + ln.Addr().String(), Namespace: "llm"}
	quiet := slog.New(slog.DiscardHandler)

	type replica struct {
		mu      sync.Mutex
		leading bool
		stop    context.CancelFunc
		done    chan struct{}
	}
	start := func(id string) *replica {
		r := &replica{done: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		r.stop = cancel
		e := &epp.Elector{Kube: kube, Name: "kvfast-epp", Identity: id, Duration: 300 * time.Millisecond, Logger: quiet}
		go func() {
			defer close(r.done)
			e.Run(ctx, func(l bool) {
				r.mu.Lock()
				r.leading = l
				r.mu.Unlock()
			})
		}()
		t.Cleanup(func() {
			cancel()
			<-r.done
		})
		return r
	}
	leads := func(r *replica) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.leading
	}
	a, b := start("epp-a"), start("epp-b")
	waitFor(t, "a leader", func() bool { return leads(a) || leads(b) })
	leader, standby, standbyID := a, b, "epp-b"
	if leads(b) {
		leader, standby, standbyID = b, a, "epp-a"
	}
	if leads(standby) {
		t.Fatal("both replicas lead")
	}
	leader.stop()
	<-leader.done
	if leads(leader) {
		t.Fatal("a stopped replica still says it leads")
	}
	waitFor(t, "the standby to take over", func() bool { return leads(standby) && f.holder("kvfast-epp") == standbyID })

	// A holder that vanished: its claim stands until it has gone
	// unrenewed for the lease duration, then a replica takes it.
	f.mu.Lock()
	f.leases["ghost"] = map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "ghost", "resourceVersion": "1000"},
		"spec":     map[string]any{"holderIdentity": "gone", "leaseDurationSeconds": 1, "renewTime": "2026-01-01T00:00:00.000000Z"}}
	f.mu.Unlock()
	e := &epp.Elector{Kube: kube, Name: "ghost", Identity: "epp-c", Duration: 300 * time.Millisecond, Logger: quiet}
	ctx, cancel := context.WithCancel(context.Background())
	took := make(chan time.Time, 1)
	begun := time.Now()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		e.Run(ctx, func(l bool) {
			if l {
				took <- time.Now()
			}
		})
	}()
	defer func() {
		cancel()
		<-ran
	}()
	select {
	case at := <-took:
		if at.Sub(begun) < 300*time.Millisecond {
			t.Fatalf("took a live-looking claim after %v, before the lease duration", at.Sub(begun))
		}
	case <-time.After(wait):
		t.Fatal("never took the abandoned lease")
	}
	if f.holder("ghost") != "epp-c" {
		t.Fatalf("ghost lease held by %q", f.holder("ghost"))
	}
}
