package main

import (
	"io"
	"strings"
	"testing"
)

func TestPrefillLoadScaleFlag(t *testing.T) {
	cfg, _, ok := serveConfig(nil, io.Discard)
	if !ok || !cfg.Sched.Cost.AutoPrefillLoadScale {
		t.Fatalf("serve's default is not --prefill-load-scale auto: %+v", *cfg.Sched.Cost)
	}
	cfg, _, ok = serveConfig([]string{"--prefill-load-scale", "7.5"}, io.Discard)
	if !ok || cfg.Sched.Cost.AutoPrefillLoadScale || cfg.Sched.Cost.PrefillLoadScale != 7.5 {
		t.Fatalf("a number did not pin the scale: %+v", *cfg.Sched.Cost)
	}
	cfg, _, ok = serveConfig([]string{"--prefill-load-scale", "2", "--prefill-load-scale", "auto"}, io.Discard)
	if !ok || !cfg.Sched.Cost.AutoPrefillLoadScale {
		t.Fatalf("auto after a number did not unpin it: %+v", *cfg.Sched.Cost)
	}
	for _, bad := range []string{"-1", "NaN", "+Inf", "fast", ""} {
		if _, _, ok := serveConfig([]string{"--prefill-load-scale", bad}, io.Discard); ok {
			t.Errorf("--prefill-load-scale %q was accepted", bad)
		}
	}
	var help strings.Builder
	serveConfig([]string{"--help"}, &help)
	if !strings.Contains(help.String(), "(default auto)") {
		t.Error("--help does not show the default auto")
	}
	o, _, code := parseDemoFlags([]string{"--prefill-load-scale", "auto"}, io.Discard)
	if code != -1 || !o.AutoPrefillLoadScale { // -1: parsed, go on
		t.Errorf("demo: --prefill-load-scale auto gave %v, exit %d", o.AutoPrefillLoadScale, code)
	}
}
