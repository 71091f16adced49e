package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/rta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

func main() {
	test := flag.Bool("test", false, "count test executables as roots too")
	allow := flag.String("allow", "", "file of keys to accept, each with a reason")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: unreached [-test] [-allow file] packages...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	n, err := run(os.Stdout, ".", flag.Args(), *test, *allow)
	if err != nil {
		fmt.Fprintln(os.Stderr, "unreached:", err)
		os.Exit(2)
	}
	if n > 0 {
		os.Exit(1)
	}
}

// finding is one source function that no call path reaches.
type finding struct {
	pos token.Position
	key string
}

// run analyses patterns, loaded from dir, writes each finding not allowed
// by allowFile to w, and returns how many it wrote.
func run(w io.Writer, dir string, patterns []string, test bool, allowFile string) (int, error) {
	allowed := map[string]bool{}
	if allowFile != "" {
		var err error
		if allowed, err = readAllow(allowFile); err != nil {
			return 0, err
		}
	}
	found, err := analyse(dir, patterns, test)
	if err != nil {
		return 0, err
	}
	n := 0
	used := map[string]bool{}
	for _, f := range found {
		if allowed[f.key] {
			used[f.key] = true
			continue
		}
		fmt.Fprintf(w, "%s:%d:%d: %s\n", f.pos.Filename, f.pos.Line, f.pos.Column, f.key)
		n++
	}
	for _, key := range slices.Sorted(maps.Keys(allowed)) {
		if !used[key] {
			fmt.Fprintf(w, "%s: %s is reached now or gone: drop it from the list\n", allowFile, key)
			n++
		}
	}
	return n, nil
}

// readAllow parses an allow file: "key reason..." per line.
func readAllow(name string) (map[string]bool, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("cannot read the allow-list: %w", err)
	}
	defer f.Close()
	allowed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) == 1:
			return nil, fmt.Errorf("%s:%d: %s has no reason", name, line, fields[0])
		case allowed[fields[0]]:
			return nil, fmt.Errorf("%s:%d: %s is listed twice", name, line, fields[0])
		}
		allowed[fields[0]] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the allow-list: %w", err)
	}
	return allowed, nil
}

// analyse returns, sorted by position, the non-generated source functions
// of the named packages' modules that no call-graph path from a root
// reaches.
func analyse(dir string, patterns []string, test bool) ([]finding, error) {
	cfg := &packages.Config{
		Dir:   dir,
		Mode:  packages.LoadAllSyntax | packages.NeedModule,
		Tests: test,
	}
	initial, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, fmt.Errorf("cannot load %v: %w", patterns, err)
	}
	if packages.PrintErrors(initial) > 0 {
		return nil, fmt.Errorf("cannot analyse %v: packages contain errors", patterns)
	}
	modules := map[string]*packages.Module{}
	for _, p := range initial {
		if p.Module != nil {
			modules[p.Module.Path] = p.Module
		}
	}

	prog, pkgs := ssautil.AllPackages(initial, ssa.InstantiateGenerics)
	prog.Build()
	var roots []*ssa.Function
	for _, m := range ssautil.MainPackages(pkgs) {
		roots = append(roots, m.Func("init"), m.Func("main"))
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("cannot analyse %v: no main package among them", patterns)
	}

	// A test build compiles a package twice (p and p [p.test]), and
	// generics are instantiated: one source function may be many SSA
	// functions, all sharing its position.
	reached := map[token.Position]bool{}
	graph := rta.Analyze(roots, true).CallGraph
	seen := map[*callgraph.Node]bool{}
	var stack []*callgraph.Node
	for _, r := range roots {
		if n := graph.Nodes[r]; n != nil && !seen[n] {
			seen[n] = true
			stack = append(stack, n)
		}
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if fn := n.Func; fn.Pos().IsValid() {
			reached[prog.Fset.Position(fn.Pos())] = true
			if o := fn.Origin(); o != nil {
				reached[prog.Fset.Position(o.Pos())] = true
			}
		}
		for _, e := range n.Out {
			if !seen[e.Callee] {
				seen[e.Callee] = true
				stack = append(stack, e.Callee)
			}
		}
	}

	var found []finding
	done := map[token.Position]bool{}
	packages.Visit(initial, nil, func(p *packages.Package) {
		mod := modules[modulePath(p)]
		if mod == nil || p.Types == nil {
			return
		}
		for _, file := range p.Syntax {
			if ast.IsGenerated(file) {
				continue
			}
			for _, decl := range file.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil { // no body: assembly, reached or not
					continue
				}
				pos := p.Fset.Position(fd.Name.Pos())
				if reached[pos] || done[pos] || isTestFile(pos.Filename) {
					continue
				}
				if fd.Recv == nil && (fd.Name.Name == "init" || fd.Name.Name == "main" && p.Name == "main") {
					continue
				}
				done[pos] = true
				if rel, err := filepath.Rel(mod.Dir, pos.Filename); err == nil {
					pos.Filename = rel
				}
				obj, _ := p.TypesInfo.Defs[fd.Name].(*types.Func)
				found = append(found, finding{pos: pos, key: key(p, mod, obj)})
			}
		}
	})
	sort.Slice(found, func(i, j int) bool {
		a, b := found[i].pos, found[j].pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Line < b.Line
	})
	return found, nil
}

// modulePath is the module a package belongs to, "" for the standard
// library and packages outside any module.
func modulePath(p *packages.Package) string {
	if p.Module == nil {
		return ""
	}
	return p.Module.Path
}

// isTestFile reports whether a file is test code: what tests alone call is
// their own business, and -test makes them roots.
func isTestFile(name string) bool { return strings.HasSuffix(name, "_test.go") }

// key names a function as the allow-list does: package directory relative
// to the module, a dot, then the function or Type.Method.
func key(p *packages.Package, mod *packages.Module, fn *types.Func) string {
	name := fn.Name()
	if recv := fn.Signature().Recv(); recv != nil {
		t := recv.Type()
		if ptr, ok := t.(*types.Pointer); ok {
			t = ptr.Elem()
		}
		if named, ok := t.(*types.Named); ok {
			name = named.Obj().Name() + "." + name
		}
	}
	if dir := strings.TrimPrefix(strings.TrimPrefix(p.PkgPath, mod.Path), "/"); dir != "" {
		return dir + "." + name
	}
	return name // the module's root package
}
