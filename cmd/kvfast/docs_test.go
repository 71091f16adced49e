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
	table := docTable(t, "../../README.md", "Every answer the router makes itself names its `code`")
	codes := errorCodes(t, "fastpath", "dispatch", "openai", "prompt")
	if len(codes) < 30 {
		t.Fatalf("found only %d error codes; the source scan has stopped finding them: %v", len(codes), codes)
	}
	// The router's own bookkeeping: a call released before its response
	// was relayed has no client left to answer.
	delete(codes, "abandoned")
	wantNamed(t, "README.md", table, codes)
}

// TestEPPDocNamesEveryErrorCode: docs/epp.md's table names every code the
// picker's own refusals carry (those of the request parser it shares with
// kvfast serve are in README.md's).
func TestEPPDocNamesEveryErrorCode(t *testing.T) {
	table := docTable(t, "../../docs/epp.md", "The picker's own refusals name their `code`")
	codes := errorCodes(t, "epp")
	if len(codes) < 8 {
		t.Fatalf("found only %d error codes; the source scan has stopped finding them: %v", len(codes), codes)
	}
	wantNamed(t, "docs/epp.md", table, codes)
}

// docTable returns the rows of the first table after intro in the
// Markdown file at path.
func docTable(t *testing.T, path, intro string) string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(text), intro)
	if !ok {
		t.Fatalf("%s lacks the error-code table's introduction %q", path, intro)
	}
	var table strings.Builder
	inTable := false
	for line := range strings.Lines(after) {
		if strings.HasPrefix(line, "|") {
			inTable = true
			table.WriteString(line)
		} else if inTable {
			break
		}
	}
	return table.String()
}

// errorCodes reads the error codes of the packages' sources, with where
// each is written.
func errorCodes(t *testing.T, pkgs ...string) map[string]string {
	t.Helper()
	codes := map[string]string{} // code -> where
	for _, pkg := range pkgs {
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
	return codes
}

func wantNamed(t *testing.T, doc, table string, codes map[string]string) {
	t.Helper()
	var missing []string
	for code, where := range codes {
		if !strings.Contains(table, "`"+code+"`") {
			missing = append(missing, code+" ("+where+")")
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("%s does not name the error code %s", doc, m)
	}
}
