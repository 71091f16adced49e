package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestREADMENamesEveryErrorCode: every error code the router's own
// answers can carry is in README.md's table of them, so that a new refusal cannot
// ship undocumented. The codes are read from the packages' sources: the
// Code of each openai.Error literal, the code given to badRequest, and
// dispatch's table of failure kinds.
func TestREADMENamesEveryErrorCode(t *testing.T) {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table: its rows, after the sentence that introduces it.
	const intro = "Every answer the router makes itself names its `code`"
	_, after, ok := strings.Cut(string(text), intro)
	if !ok {
		t.Fatalf("README.md lacks the error-code table's introduction %q", intro)
	}
	var readme strings.Builder
	inTable := false
	for line := range strings.Lines(after) {
		if strings.HasPrefix(line, "|") {
			inTable = true
			readme.WriteString(line)
		} else if inTable {
			break
		}
	}
	codes := map[string]string{} // code -> where
	for _, pkg := range []string{"fastpath", "dispatch", "openai", "prompt"} {
		files, err := filepath.Glob(filepath.Join("../..", pkg, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				var lit ast.Expr
				switch n := n.(type) {
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && (k.Name == "Code" || k.Name == "code") {
						lit = n.Value
					}
				case *ast.CompositeLit:
					// dispatch's kinds: {ErrX, "code"}, unkeyed.
					if filepath.Base(f) == "errors.go" && pkg == "dispatch" && len(n.Elts) == 2 {
						if _, keyed := n.Elts[0].(*ast.KeyValueExpr); !keyed {
							lit = n.Elts[1]
						}
					}
				case *ast.CallExpr:
					if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "badRequest" && len(n.Args) == 3 {
						lit = n.Args[1]
					}
				}
				if b, ok := lit.(*ast.BasicLit); ok && b.Kind == token.STRING {
					if code, err := strconv.Unquote(b.Value); err == nil && code != "" {
						codes[code] = fset.Position(b.Pos()).String()
					}
				}
				return true
			})
		}
	}
	if len(codes) < 30 {
		t.Fatalf("found only %d error codes; the source scan has stopped finding them: %v", len(codes), codes)
	}
	// The router's own bookkeeping: a call released before its response
	// was relayed has no client left to answer.
	delete(codes, "abandoned")
	var missing []string
	for code, where := range codes {
		if !strings.Contains(readme.String(), "`"+code+"`") {
			missing = append(missing, code+" ("+where+")")
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("README.md does not name the error code %s", m)
	}
}
