package main

import (
	"os"
	"strings"
	"testing"
)

// TestRepositoryDockerfile: kvfast's own Dockerfile passes.
func TestRepositoryDockerfile(t *testing.T) {
	problems, err := checkFile("../../Dockerfile")
	if err != nil || len(problems) > 0 {
		t.Fatalf("the Dockerfile: %v %q", err, problems)
	}
}

func TestCheckFindsProblems(t *testing.T) {
	good, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"cgo", "CGO_ENABLED=0 go build", "go build", "CGO_ENABLED=0"},
		{"root", "USER 65532:65532", "USER root", "runs as root"},
		{"no user", "USER 65532:65532\n", "", "sets no USER"},
		{"full base", "gcr.io/distroless/static-debian12:nonroot", "debian:bookworm", "want scratch or distroless"},
		{"lint", "AS build", "as build", "FromAsCasing"},
		{"unknown instruction", "EXPOSE 8000", "EXPOZE 8000", "unknown instruction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(string(good), tc.from, tc.to, 1)
			if src == string(good) {
				t.Fatalf("%q is not in the Dockerfile", tc.from)
			}
			problems, err := check([]byte(src))
			all := strings.Join(problems, "\n")
			if err != nil {
				all += err.Error()
			}
			if !strings.Contains(all, tc.want) {
				t.Errorf("want a complaint with %q, got %q", tc.want, all)
			}
		})
	}
	single := "FROM scratch\nUSER 1000\n"
	if problems, _ := check([]byte(single)); len(problems) == 0 || !strings.Contains(problems[0], "stage") {
		t.Errorf("a single stage passed: %q", problems)
	}
}
