package main

import (
	"strings"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
)

func TestWorkerFlagZMQKeys(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  fastpath.StaticWorker
		err   string
	}{
		{value: "url=http://127.0.0.1:8001,model=m,zmq=tcp://127.0.0.1:5557",
			want: fastpath.StaticWorker{Endpoint: "http://127.0.0.1:8001", Model: "m", Events: "tcp://127.0.0.1:5557"}},
		{value: "url=http://h:1,id=3,rank=1,model=m,zmq=tcp://h:5558,replay=tcp://h:5559,topic=kv-events",
			want: fastpath.StaticWorker{ID: 3, DPRank: 1, Endpoint: "http://h:1", Model: "m", Events: "tcp://h:5558",
				Replay: "tcp://h:5559", Topic: "kv-events"}},
		{value: "url=http://h:1,zmq=tcp://h:5557", err: "needs model"},
		{value: "url=http://h:1,model=m,zmq=tcp://*:5557", err: "wildcard"},
		{value: "url=http://h:1,model=m,zmq=tcp://h:5557,replay=h:5558", err: "replay"},
		{value: "url=http://h:1,model=m,topic=kv-events", err: "belong to"},
	} {
		var w workerFlags
		err := w.Set(tc.value)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, want an error about %q", tc.value, err, tc.err)
			}
			continue
		}
		if err != nil || len(w) != 1 || w[0] != tc.want {
			t.Errorf("%q: got %+v, %v", tc.value, w, err)
		}
	}
}
