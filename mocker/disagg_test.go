package mocker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

func tokenPrompt(n, seed int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint((i*7919 + seed*104729) % 30000)
	}
	return "[" + strings.Join(ids, ",") + "]"
}

// TestVLLMTransfer: a prefill engine keeps a prompt's blocks and names
// them; a decode engine pulls them once and decodes without computing
// them; a second pull of the same blocks is refused, and so are requests
// of the wrong role.
func TestVLLMTransfer(t *testing.T) {
	pre := startEngine(t, Config{Role: workers.RolePrefill, BlockSize: 16, Speedup: 1000})
	dec := startEngine(t, Config{Role: workers.RoleDecode, BlockSize: 16, Speedup: 1000})
	prompt := tokenPrompt(100, 1)
	status, body := do(t, "POST", pre.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":1,"stream":false,`+
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
	if status != 200 {
		t.Fatalf("prefill: %d %s", status, body)
	}
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatal(err)
	}
	var kv kvTransferParams
	if err := json.Unmarshal(ans.KV, &kv); err != nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.RemoteBlockIDs) != 6 ||
		kv.RemoteHost == nil || kv.RemotePort == nil || kv.RemoteRequestID == nil || kv.RemoteEngineID == nil {
		t.Fatalf("prefill answered kv_transfer_params %s (%v)", ans.KV, err)
	}
	if held := pre.Stats().KVHeld; held < 6 {
		t.Errorf("prefill engine holds %d blocks after finishing, want the 6 kept for the decode", held)
	}
	decodeBody := `{"prompt":` + prompt + `,"max_tokens":4,"kv_transfer_params":` + string(ans.KV) + `}`
	if status, body := do(t, "POST", dec.URL()+"/v1/completions", decodeBody); status != 200 {
		t.Fatalf("decode: %d %s", status, body)
	}
	if s := dec.Stats(); s.BlocksTransferred != 6 || s.PrefillTokens != 4 {
		t.Errorf("decode engine: %d blocks transferred, %d tokens prefilled; want 6 and the last 4 prompt tokens", s.BlocksTransferred, s.PrefillTokens)
	}
	eventually(t, "the prefill engine to free the pulled blocks", func() bool { return pre.Stats().KVHeld == 0 })
	if status, body := do(t, "POST", dec.URL()+"/v1/completions", decodeBody); status != 400 || !strings.Contains(string(body), "no longer held") {
		t.Errorf("a second decode of the same blocks: %d %s; want 400", status, body)
	}
	if status, _ := do(t, "POST", dec.URL()+"/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"do_remote_decode":true}}`); status != 400 {
		t.Errorf("a decode engine accepted a prefill for a remote decode: %d", status)
	}
	if status, _ := do(t, "POST", pre.URL()+"/v1/completions", decodeBody); status != 400 {
		t.Errorf("a prefill engine accepted a remote prefill's decode: %d", status)
	}
}

// TestTransferTimeout: blocks no decode pulls are freed after the
// transfer timeout, and a late pull is refused.
func TestTransferTimeout(t *testing.T) {
	pre := startEngine(t, Config{Role: workers.RolePrefill, BlockSize: 16, Speedup: 1000, TransferTimeout: time.Millisecond})
	dec := startEngine(t, Config{BlockSize: 16, Speedup: 1000})
	prompt := tokenPrompt(64, 2)
	_, body := do(t, "POST", pre.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || len(ans.KV) == 0 {
		t.Fatalf("prefill answer %s: %v", body, err)
	}
	eventually(t, "the prefill engine to free blocks nobody pulled", func() bool { return pre.Stats().KVHeld == 0 })
	if status, _ := do(t, "POST", dec.URL()+"/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":`+string(ans.KV)+`}`); status != 400 {
		t.Errorf("decode of expired blocks: %d, want 400", status)
	}
}

// TestSGLangBootstrapNeedsItsPort: SGLang fills a missing bootstrap_port
// with its own default; the mock serves its bootstrap on its HTTP port,
// which it cannot guess for another engine, so it says what the router
// must send instead of pairing nothing; the three fields still go
// together otherwise.
func TestSGLangBootstrapNeedsItsPort(t *testing.T) {
	e := startEngine(t, Config{Role: workers.RolePrefill, BlockSize: 16, Speedup: 1000, SGLangBootstrap: true})
	prompt := tokenPrompt(40, 2)
	status, body := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+prompt+`,"bootstrap_host":"127.0.0.1","bootstrap_room":7}`)
	if status != 400 || !strings.Contains(string(body), "--disagg-bootstrap-port http") {
		t.Errorf("no bootstrap_port: %d %s", status, body)
	}
	if status, body := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+prompt+`,"bootstrap_port":1,"bootstrap_room":7}`); status != 400 || !strings.Contains(string(body), "go together") {
		t.Errorf("no bootstrap_host: %d %s", status, body)
	}
}
