package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

func checkFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the Dockerfile: %w", err)
	}
	return check(b)
}

// check returns what is wrong with the Dockerfile src; an error means it
// does not even parse.
func check(src []byte) ([]string, error) {
	res, err := parser.Parse(bytes.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("cannot parse: %w", err)
	}
	var problems []string
	for _, w := range res.Warnings {
		line := 0
		if w.Location != nil {
			line = w.Location.Start.Line
		}
		problems = append(problems, fmt.Sprintf("line %d: %s", line, w.Short))
	}
	lint := linter.New(&linter.Config{Warn: func(rule, description, url, msg string, loc []parser.Range) {
		problems = append(problems, fmt.Sprintf("line %d: %s: %s", startLine(loc), rule, msg))
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		return nil, fmt.Errorf("cannot read the instructions: %w", err)
	}
	return append(problems, policy(stages)...), nil
}

func startLine(loc []parser.Range) int {
	if len(loc) == 0 {
		return 0
	}
	return loc[0].Start.Line
}

// runtimeBase are the bases the runtime stage may use: no shell, no
// package manager, nothing the router does not need.
var runtimeBase = regexp.MustCompile(`^(scratch|gcr\.io/distroless/static[a-z0-9-]*(:[a-z0-9._-]+)?(@sha256:[0-9a-f]{64})?)$`)

// policy holds the stages to kvfast's image rules.
func policy(stages []instructions.Stage) []string {
	if len(stages) < 2 {
		return []string{fmt.Sprintf("%d stage: want a build stage and a runtime stage", len(stages))}
	}
	var problems []string
	static := false
	for _, st := range stages[:len(stages)-1] {
		for _, cmd := range st.Commands {
			if run, ok := cmd.(*instructions.RunCommand); ok {
				line := strings.Join(run.CmdLine, " ")
				if strings.Contains(line, "go build") && strings.Contains(line, "CGO_ENABLED=0") {
					static = true
				}
			}
		}
	}
	if !static {
		problems = append(problems, "no build stage runs go build with CGO_ENABLED=0: the binary would not be static")
	}
	final := stages[len(stages)-1]
	if !runtimeBase.MatchString(final.BaseName) {
		problems = append(problems, fmt.Sprintf("runtime stage FROM %s: want scratch or distroless/static", final.BaseName))
	}
	user := ""
	for _, cmd := range final.Commands {
		if u, ok := cmd.(*instructions.UserCommand); ok {
			user = u.User
		}
	}
	switch name, _, _ := strings.Cut(user, ":"); name {
	case "":
		problems = append(problems, "the runtime stage sets no USER: the router would run as root")
	case "root", "0":
		problems = append(problems, "the runtime stage runs as root")
	}
	return problems
}
