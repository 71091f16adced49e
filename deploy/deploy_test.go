package deploy_test

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

const (
	rulesFile     = "prometheus/kvfast-rules.yml"
	rulesTestFile = "prometheus/kvfast-rules.test.yml"
	dashboardFile = "grafana/kvfast-dashboard.json"
)

// dashboard is the part of Grafana's dashboard model the checks read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("cannot parse %s: %v", dashboardFile, err)
	}
	return d
}

// panelTypes are the panel types the dashboard may use: Grafana's own,
// so that it imports without plugins.
var panelTypes = map[string]bool{"row": true, "timeseries": true, "state-timeline": true, "stat": true, "gauge": true, "table": true}

// TestDashboardSchema checks the dashboard against what Grafana needs to
// import it: identity, schema version, unique panel ids, panels on the
// 24-column grid, known types, every query on the dashboard's data-source
// variable, unique refIds per panel, and only variables it defines.
func TestDashboardSchema(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want all set, schema 36 or later", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Error("no datasource variable: the dashboard would be tied to one data source's uid")
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 || ids[p.ID] {
			t.Errorf("%s: id missing or repeated", where)
		}
		ids[p.ID] = true
		if !panelTypes[p.Type] || p.Title == "" {
			t.Errorf("%s: type %q, want one of Grafana's built-in types and a title", where, p.Type)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			t.Errorf("%s: gridPos %+v off the 24-column grid", where, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: data source %+v, want prometheus ${datasource}", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			queries++
			if q.RefID == "" || refs[q.RefID] || strings.TrimSpace(q.Expr) == "" {
				t.Errorf("%s: query %q with refId %q: want an expression and a unique refId", where, q.Expr, q.RefID)
			}
			refs[q.RefID] = true
			for _, m := range variableRE.FindAllStringSubmatch(q.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("%s: query uses $%s, which the dashboard does not define", where, m[1])
				}
			}
		}
	}
	if queries < 15 {
		t.Errorf("%d queries: the dashboard lost its panels", queries)
	}
}

var (
	variableRE    = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	metricRE      = regexp.MustCompile(`\bkvfast_[a-z0-9_]+\b`)
	recordedRE    = regexp.MustCompile(`\bkvfast:[a-z0-9_:]+`)
	labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	recordRE      = regexp.MustCompile(`(?m)^\s*-?\s*record:\s*(\S+)\s*$`)
)

// dashboardExprs are the PromQL expressions of the dashboard's queries and
// variables.
func dashboardExprs(t *testing.T) []string {
	d := readDashboard(t)
	var exprs []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// Grafana's label_values(SELECTOR, LABEL) is not PromQL: its
		// selector is.
		m := labelValuesRE.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(SELECTOR, LABEL)", v.Name, v.Definition)
			continue
		}
		exprs = append(exprs, m[1])
	}
	return exprs
}

// promtool finds promtool, or skips the test where it may be missing:
// anywhere but CI (CI=true), where scripts/setup-test-deps.sh installs it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("promtool is missing in CI: scripts/setup-test-deps.sh installs it (Debian's prometheus package)")
	}
	t.Skip("promtool is not installed (Debian: apt-get install prometheus, or KVFAST_INSTALL_DEPS=1 scripts/setup-test-deps.sh as root)")
	return ""
}

func runPromtool(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestRulesPassPromtool: the rules load (promtool check rules) and
// behave as their unit tests say (promtool test rules); and every
// dashboard query is valid PromQL, checked by loading them as recording
// rules with Grafana's variables replaced.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	runPromtool(t, bin, "check", "rules", rulesFile)
	runPromtool(t, bin, "test", "rules", rulesTestFile)

	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$instance", ".*", "$worker", ".*")
	for i, e := range dashboardExprs(t) {
		q, _ := json.Marshal(grafana.Replace(e)) // a JSON string is a YAML double-quoted scalar
		fmt.Fprintf(&b, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, bin, "check", "rules", file)
}

// TestRulesAndDashboardUseExportedMetrics starts a router with a worker
// registered in its segment (the shared-memory feed) and one publishing
// over ZMQ, scrapes /metrics once every series has appeared, and checks
// that every kvfast_ metric the rules and the dashboard name is exported,
// and every recorded series they use is recorded by the rules.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	rulesText, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string][]string{} // metric -> where
	for _, m := range metricRE.FindAllString(string(rulesText), -1) {
		used[m] = append(used[m], rulesFile)
	}
	recorded := map[string]bool{}
	for _, m := range recordRE.FindAllStringSubmatch(string(rulesText), -1) {
		recorded[m[1]] = true
	}
	for _, m := range recordedRE.FindAllString(string(rulesText), -1) {
		if !recorded[m] {
			t.Errorf("%s uses %s, which no rule records", rulesFile, m)
		}
	}
	for _, e := range dashboardExprs(t) {
		for _, m := range metricRE.FindAllString(e, -1) {
			used[m] = append(used[m], dashboardFile)
		}
		for _, m := range recordedRE.FindAllString(e, -1) {
			if !recorded[m] {
				t.Errorf("%s uses %s, which no rule records", dashboardFile, m)
			}
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d metrics named: the files lost their queries", len(used))
	}

	zmqEngine, err := mocker.Start(mocker.Config{Listen: "127.0.0.1:0", Model: mocker.DefaultModel, KVBlocks: 256,
		ZMQ: mocker.ZMQConfig{Listen: "tcp://127.0.0.1:0", Format: mocker.ZMQVLLM, Topic: "kv"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zmqEngine.Close() })
	cfg := rigtest.Config()
	cfg.Static = []node.StaticWorker{{ID: 100, Endpoint: zmqEngine.Addr(), Model: mocker.DefaultModel,
		Events: zmqEngine.ZMQEndpoint(), Topic: "kv"}}
	r := rigtest.Start(t, rig.Config{Node: cfg, Engines: 1, Engine: mocker.Config{WorkerID: 1, Speedup: 20}})

	var exported map[string]bool
	deadline := time.Now().Add(rig.DefaultWaitTimeout)
	for {
		exported = scrape(t, r.URL+"/metrics")
		missing := missingMetrics(used, exported)
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, m := range missing {
				t.Errorf("%s is used by %s but the router does not export it", m, strings.Join(slices.Compact(used[m]), ", "))
			}
			return
		}
		// The per-worker series appear once the workers have joined:
		// poll the condition, not a fixed delay.
		time.Sleep(20 * time.Millisecond)
	}
}

func missingMetrics(used map[string][]string, exported map[string]bool) []string {
	var missing []string
	for _, m := range slices.Sorted(maps.Keys(used)) {
		if !exported[m] {
			missing = append(missing, m)
		}
	}
	return missing
}

// scrape returns the names of the series a /metrics page exports.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rig.DefaultWaitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, %v", url, resp.StatusCode, err)
	}
	names := map[string]bool{}
	for line := range strings.Lines(string(body)) {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// TestSystemdUnitsVerify runs systemd-analyze verify on the units, which
// reports unknown keys and values it cannot parse; the router's binary is
// swapped for /bin/true, as the test has none installed. Skipped where
// systemd-analyze is missing (it is not needed elsewhere).
func TestSystemdUnitsVerify(t *testing.T) {
	bin, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: systemd)")
	}
	dir := t.TempDir()
	var units []string
	for name, instance := range map[string]string{"kvfast.service": "kvfast.service", "kvfast-engine@.service": "kvfast-engine@0.service"} {
		b, err := os.ReadFile(filepath.Join("systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "/usr/local/bin/kvfast", "/bin/true")
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, filepath.Join(dir, instance))
	}
	out, err := exec.Command(bin, append([]string{"verify"}, units...)...).CombinedOutput()
	// verify exits 0 on keys it ignores: any complaint fails the test.
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDockerfileBuildsStaticBinary runs the Dockerfile's own go build
// command (its build stage's RUN line) on this machine and checks that the
// binary is static: no program interpreter, no shared libraries. That is
// what lets it run on distroless's static base, which has no libc. make
// lint checks the rest of the Dockerfile (tools/dockerfilecheck).
func TestDockerfileBuildsStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the router from scratch: not in -short")
	}
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .* -o )/out/kvfast( \./cmd/kvfast)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("the Dockerfile has no RUN CGO_ENABLED=0 go build ... -o /out/kvfast ./cmd/kvfast")
	}
	bin := filepath.Join(t.TempDir(), "kvfast")
	cmd := exec.Command("sh", "-c", string(m[1])+bin+string(m[2]))
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %q (%v)", libs, err)
	}
}
