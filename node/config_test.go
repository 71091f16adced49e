package node

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

func TestDefaultConfigValidates(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig does not validate: %v", err)
	}
	// Each call is a fresh value: a caller tuning its cost model must not
	// change the next caller's defaults.
	a, b := DefaultConfig(), DefaultConfig()
	a.Sched.Cost.PrefillLoadScale = 99
	if b.Sched.Cost.PrefillLoadScale == 99 {
		t.Fatal("DefaultConfig values share their cost parameters")
	}
}

func TestValidateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"zero registry poll", func(c *Config) { c.RegistryPoll = 0 }, "registry poll"},
		{"negative heartbeat grace", func(c *Config) { c.HeartbeatGrace = -time.Second }, "--heartbeat-grace"},
		{"negative down retention", func(c *Config) { c.DownRetention = -time.Second }, "--down-retention"},
		{"zero approx TTL", func(c *Config) { c.Approx.TTL = 0 }, "--approx-ttl"},
		{"zero shutdown timeout", func(c *Config) { c.ShutdownTimeout = 0 }, "--shutdown-timeout"},
		{"zero index capacity", func(c *Config) { c.Segment.IndexCapacity = 0 }, "--index-capacity"},
		{"blank static model", func(c *Config) { c.Static = []StaticWorker{{Endpoint: "127.0.0.1:1", Model: " "}} }, "model name"},
		{"zero index worker share", func(c *Config) { c.Segment.IndexWorkerShare = 0 }, "--index-worker-share"},
		{"index worker share over 1", func(c *Config) { c.Segment.IndexWorkerShare = 1.5 }, "--index-worker-share"},
		{"zero approx capacity", func(c *Config) { c.Approx.Capacity = 0 }, "approx capacity"},
		{"zero block size", func(c *Config) { c.Sched.BlockSize = 0 }, "--block-size"},
		{"a block larger than the ring takes", func(c *Config) { c.Segment.RingBytes, c.Sched.BlockSize = 4096, 256 }, "no engine could publish one block"},
		{"too many static workers", func(c *Config) {
			c.Static = make([]StaticWorker, workers.Max+1)
		}, "static workers"},
		{"duplicate static worker", func(c *Config) {
			c.Static = []StaticWorker{{ID: 1, Endpoint: "127.0.0.1:1"}, {ID: 2, Endpoint: "127.0.0.1:2"}, {ID: 1, Endpoint: "127.0.0.1:3"}}
		}, "static workers 1 and 3: both are worker id 1 rank 0"},
		{"response budget under one response", func(c *Config) {
			c.Dispatch.ResponseBudgetBytes = int64(c.Dispatch.MaxResponseBodySize) - 1
		}, "--response-budget-bytes"},
		{"unknown policy", func(c *Config) { c.Policy = "fastest" }, "fastest"},
		{"empty policy", func(c *Config) { c.Policy = "" }, "policy"},
		{"front end: zero queue timeout", func(c *Config) { c.HTTP.QueueTimeout = 0 }, "--queue-timeout"},
		{"front end: negative retries", func(c *Config) { c.HTTP.MaxRetries = -1 }, "--max-retries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.change(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tc.want)
			}
			// New refuses what Validate refuses, before opening anything.
			cfg.Segment.Path = t.TempDir() + "/never-created.shm"
			if n, err := New(cfg); err == nil {
				_ = n.Close()
				t.Fatal("New accepted a configuration Validate refuses")
			}
		})
	}
}

func TestParseStaticWorker(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  StaticWorker
		err   string
	}{
		{value: "url=http://127.0.0.1:8001", want: StaticWorker{ID: 7, Endpoint: "http://127.0.0.1:8001"}},
		{value: "http://127.0.0.1:8001", want: StaticWorker{ID: 7, Endpoint: "http://127.0.0.1:8001"}},
		{value: " 127.0.0.1:8001 ,model=m", want: StaticWorker{ID: 7, Endpoint: "127.0.0.1:8001", Model: "m"}},
		{value: "http://h:1,url=http://h:2", err: "url= is given twice"},
		{value: "http://h:1?api_key=zzz", err: "a query or a fragment in a worker's URL are not sent"},
		{value: "http://h:1,model", err: "item 2 has no '='"},
		{value: "", err: "item 1 has no '='"},
		{value: "endpoint=127.0.0.1:8001, model=m, kv-blocks=512, dp-rank=2",
			want: StaticWorker{ID: 7, DPRank: 2, Endpoint: "127.0.0.1:8001", Model: "m", KVBlocks: 512}},
		{value: "url=http://127.0.0.1:8001,model=m,zmq=tcp://127.0.0.1:5557",
			want: StaticWorker{ID: 7, Endpoint: "http://127.0.0.1:8001", Model: "m", Events: "tcp://127.0.0.1:5557"}},
		{value: "url=http://h:1,id=3,rank=1,model=m,zmq=tcp://h:5558,replay=tcp://h:5559,topic=kv-events",
			want: StaticWorker{ID: 3, DPRank: 1, Endpoint: "http://h:1", Model: "m", Events: "tcp://h:5558",
				Replay: "tcp://h:5559", Topic: "kv-events"}},
		{value: "url=http://h:1,role=prefill", want: StaticWorker{ID: 7, Endpoint: "http://h:1", Role: workers.RolePrefill}},
		{value: "url=http://h:1,role=decode", want: StaticWorker{ID: 7, Endpoint: "http://h:1", Role: workers.RoleDecode}},
		{value: "url=http://h:1,role=encode", want: StaticWorker{ID: 7, Endpoint: "http://h:1", Role: workers.RoleEncode}},
		{value: "url=http://h:1,role=vision", err: "role="},
		{value: "url=http://h:1,role=prefill,bootstrap-port=8999", want: StaticWorker{ID: 7, Endpoint: "http://h:1", Role: workers.RolePrefill, BootstrapPort: 8999}},
		{value: "url=http://h:1,role=prefill,bootstrap_port=8999", want: StaticWorker{ID: 7, Endpoint: "http://h:1", Role: workers.RolePrefill, BootstrapPort: 8999}},
		{value: "url=http://h:1,role=prefill,bootstrap_port=0", err: "want a port"},
		{value: "url=http://h:1,role=prefill,bootstrap-port=70000", err: "want a port"},
		{value: "url=http://h:1,role=decode,bootstrap-port=8999", err: "belongs to a prefill worker"},
		{value: "model=m", err: "needs url"},
		{value: "url=http://h:1/some/prefix,model=m", err: "a path in a worker's URL is not sent"},
		{value: "url=http://h:1/,model=m", want: StaticWorker{ID: 7, Endpoint: "http://h:1/", Model: "m"}},
		{value: "url=http://h:1/v1,model=m", want: StaticWorker{ID: 7, Endpoint: "http://h:1/v1", Model: "m"}},
		{value: "url=http://h:1,id", err: "key=value"},
		{value: "url=http://h:1,colour=red", err: "the key of item 2"},
		{value: "url=http://h:1,id=x", err: "id="},
		{value: "url=http://h:1,rank=4294967296", err: "rank="},
		{value: "url=https://h:1", err: "only http"},
		{value: "url=h", err: "host:port"},
		{value: "url=http://h:1,zmq=tcp://h:5557", err: "needs model"},
		{value: "url=http://h:1,model=m,zmq=tcp://*:5557", err: "wildcard"},
		{value: "url=http://h:1,model=m,zmq=tcp://h:5557,replay=h:5558", err: "replay"},
		{value: "url=http://h:1,model=m,topic=kv-events", err: "belong to"},
		{value: "url=http://h:1,model=m,zmq=tcp://h:5557,zmq=tcp://h:5558", err: "zmq= is given twice"},
		{value: "url=http://h:1,endpoint=http://h:2", err: "endpoint= repeats url="},
		{value: "url=http://h:1,model=m,model=n", err: "model= is given twice"},
		{value: "url=http://h:1,model=m,zmq=tcp://h:5557,replay=tcp://h:5557", err: "not its zmq= event socket"},
	} {
		got, err := ParseStaticWorker(tc.value, 7)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %+v, %v; want an error about %q", tc.value, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.value, got, err, tc.want)
		}
	}
}

// TestZeroMeansOff: a zero the operator sets is off, not "the default",
// even where sched and dispatch read zero as their default; negative
// values are refused rather than guessed at.
func TestZeroMeansOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sched.QueueCapacity = 0
	cfg.Dispatch.Timeouts.Connect = 0
	cfg.Dispatch.Timeouts.FirstByte = 0
	cfg.Dispatch.Health.Interval = 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, d := cfg.libraryConfigs()
	if s.QueueCapacity >= 0 {
		t.Errorf("queue capacity 0 reached sched as %d, which it reads as its default", s.QueueCapacity)
	}
	if d.Timeouts.Connect >= 0 || d.Timeouts.FirstByte >= 0 || d.Health.Interval >= 0 {
		t.Errorf("zero timeouts reached dispatch as %+v %+v, which it reads as its defaults", d.Timeouts, d.Health)
	}
	if d.Timeouts.Idle != DefaultConfig().Dispatch.Timeouts.Idle {
		t.Errorf("an untouched timeout changed: %v", d.Timeouts.Idle)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Sched.QueueCapacity = -1 },
		func(c *Config) { c.Dispatch.Health.Interval = -time.Second },
		func(c *Config) { c.Dispatch.Timeouts.Idle = -time.Second },
	} {
		c := DefaultConfig()
		bad(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("a negative setting was accepted: %+v %+v", c.Sched.QueueCapacity, c.Dispatch)
		}
	}
}

func TestCheckModelName(t *testing.T) {
	for _, ok := range []string{"", "mock", "Qwen/Qwen3-8B", "my model", "modèle-é"} {
		if err := checkModelName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{" ", "  ", " mock", "mock ", "a\u2028b", "a\nb", "a\x1b[2Jb", "a\tb"} {
		if err := checkModelName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
