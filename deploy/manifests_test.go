package deploy_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/node"
)

// podContainer is what the checks read of one container of a manifest's
// pod template.
type podContainer struct {
	name, image, pullPolicy string
	command, args           []string
}

// runsKvfast: the container runs kvfast, by its image's name, by its
// command, or, with the image's entrypoint, by a first argument that is
// one of kvfast's commands the manifests run. So a container is still
// found after its image is renamed.
func (c podContainer) runsKvfast() bool {
	repo := c.image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	if strings.Contains(path.Base(repo), "kvfast") {
		return true
	}
	if len(c.command) > 0 {
		return path.Base(c.command[0]) == "kvfast"
	}
	return len(c.args) > 0 && (c.args[0] == "serve" || c.args[0] == "epp")
}

// manifestDoc is one YAML document of a manifest.
type manifestDoc struct {
	where      string // file, and the document's index in it
	text       string
	containers []podContainer
}

var (
	docSeparatorRE = regexp.MustCompile(`(?m)^---[ \t]*$`)
	imageLineRE    = regexp.MustCompile(`(?m)^[ \t]*(- )?image:`)
	graceRE        = regexp.MustCompile(`(?m)^[ \t]*terminationGracePeriodSeconds:[ \t]*(\d+)[ \t]*$`)
	recreateRE     = regexp.MustCompile(`(?m)^[ \t]*type:[ \t]*Recreate[ \t]*$`)
	noSurgeRE      = regexp.MustCompile(`(?m)^[ \t]*maxSurge:[ \t]*0[ \t]*$`)
)

// readManifests reads every manifest under kubernetes/ (kustomizations
// aside) document by document.
func readManifests(t *testing.T) []manifestDoc {
	t.Helper()
	var docs []manifestDoc
	err := filepath.WalkDir("kubernetes", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") || d.Name() == "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, text := range docSeparatorRE.Split(string(b), -1) {
			docs = append(docs, manifestDoc{where: p + " document " + strconv.Itoa(i+1), text: text, containers: parseContainers(text)})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func indentOf(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }

// parseContainers reads the containers: lists of a manifest written as
// this repository writes them (block style, items indented under their
// key): each item's name, image, imagePullPolicy, and the scalars listed
// under its command: and args:.
func parseContainers(doc string) []podContainer {
	lines := strings.Split(doc, "\n")
	var out []podContainer
	for i := 0; i < len(lines); i++ {
		if tr := strings.TrimSpace(lines[i]); tr != "containers:" && tr != "initContainers:" {
			continue
		}
		base, item, first := indentOf(lines[i]), -1, len(out)
		key := "" // the container's key whose list is being read
		for i++; i < len(lines); i++ {
			tr := strings.TrimSpace(lines[i])
			if tr == "" || strings.HasPrefix(tr, "#") {
				continue
			}
			ind := indentOf(lines[i])
			if ind <= base {
				i-- // the next key of the pod spec
				break
			}
			if item < 0 {
				item = ind
			}
			if ind == item && strings.HasPrefix(tr, "- ") {
				out = append(out, podContainer{})
				tr, ind = strings.TrimPrefix(tr, "- "), item+2
			}
			if len(out) == first || ind < item+2 {
				break // not the shape this reads: the image-line count catches it
			}
			c := &out[len(out)-1]
			if ind == item+2 {
				k, v, _ := strings.Cut(tr, ":")
				key, v = k, strings.Trim(strings.TrimSpace(v), `"'`)
				switch k {
				case "name":
					c.name = v
				case "image":
					c.image = v
				case "imagePullPolicy":
					c.pullPolicy = v
				}
				continue
			}
			if v, ok := strings.CutPrefix(tr, "- "); ok {
				v = strings.Trim(v, `"'`)
				switch key {
				case "command":
					c.command = append(c.command, v)
				case "args":
					c.args = append(c.args, v)
				}
			}
		}
	}
	return out
}

// TestManifestsRunKvfastAsShipped checks what the Kubernetes manifests'
// kvfast containers need beyond their flags (which cmd/kvfast's
// TestManifestsUseRealFlags checks, finding them by the line "image:
// kvfast:latest"): every container that runs kvfast, found by what it
// runs, is named kvfast:latest, so that that test sees it and overlays
// rename one image; IfNotPresent, so that the kubelet runs the node's
// image instead of pulling docker.io/library/kvfast; a termination grace
// period longer than the drain; and rollout strategies that can finish.
func TestManifestsRunKvfastAsShipped(t *testing.T) {
	// SIGTERM drains for --shutdown-timeout (epp: --drain-timeout, the
	// same 30 s), after the router's --shutdown-delay, then the router
	// flushes spans for at most 5 s.
	drain := node.DefaultConfig().ShutdownTimeout + 5*time.Second
	found := 0
	for _, d := range readManifests(t) {
		parsed := 0
		for _, c := range d.containers {
			if c.image != "" {
				parsed++
			}
		}
		if n := len(imageLineRE.FindAllString(d.text, -1)); n != parsed {
			t.Errorf("%s: %d image lines but %d containers read: write containers as the other manifests do, so that none goes unchecked", d.where, n, parsed)
		}
		kvfast := false
		var delay time.Duration // the longest --shutdown-delay, served before the drain
		for _, c := range d.containers {
			if !c.runsKvfast() {
				continue
			}
			kvfast = true
			for _, a := range c.args {
				if v, ok := strings.CutPrefix(a, "--shutdown-delay="); ok {
					dl, err := time.ParseDuration(v)
					if err != nil {
						t.Errorf("%s: container %s: %s: %v", d.where, c.name, a, err)
					}
					delay = max(delay, dl)
				}
			}
			found++
			if c.image != "kvfast:latest" {
				t.Errorf("%s: container %s runs image %q: keep kvfast:latest (TestManifestsUseRealFlags finds kvfast's containers by it) and rename it in an overlay (images:, docs/deploy.md)", d.where, c.name, c.image)
			}
			if c.pullPolicy != "IfNotPresent" {
				t.Errorf("%s: container %s has imagePullPolicy %q, want IfNotPresent: for a :latest image the default is Always, which pulls docker.io/library/kvfast", d.where, c.name, c.pullPolicy)
			}
			if slices.Contains(c.args, "--leader-elect") && !recreateRE.MatchString(d.text) {
				t.Errorf("%s: container %s elects a leader but the Deployment's strategy is not Recreate: a rolling update waits for a standby that is never ready", d.where, c.name)
			}
		}
		if !kvfast {
			continue
		}
		m := graceRE.FindStringSubmatch(d.text)
		if m == nil {
			t.Errorf("%s: no terminationGracePeriodSeconds: the default 30 s SIGKILLs kvfast before its drain (%v) ends", d.where, drain)
		} else if s, _ := strconv.Atoi(m[1]); time.Duration(s)*time.Second <= delay+drain {
			t.Errorf("%s: terminationGracePeriodSeconds %s, want more than the shutdown delay and the drain (%v)", d.where, m[1], delay+drain)
		}
		// A pod that takes a whole GPU node (one per host) has no room to
		// start beside its predecessor unless a GPU node is spare.
		if strings.Contains(d.text, "topologyKey: kubernetes.io/hostname") && strings.Contains(d.text, "nvidia.com/gpu") && !noSurgeRE.MatchString(d.text) {
			t.Errorf("%s: one pod per GPU node without maxSurge: 0: a rollout waits for a spare GPU node", d.where)
		}
	}
	if found < 4 {
		t.Fatalf("found %d containers running kvfast in kubernetes/, want 4 or more", found)
	}
}

// vllmEventEndpointRE finds the endpoint of a vLLM --kv-events-config.
var vllmEventEndpointRE = regexp.MustCompile(`"endpoint":\s*"([^"]*)"`)

// TestManifestsBindVLLMEventSockets: vLLM's ZMQ publisher binds its
// endpoint only when it is a wildcard (tcp://*:PORT, an IPv6 "::"
// address) or ipc:// and connects out otherwise, so an engine given
// tcp://127.0.0.1:5557 listens nowhere and the router's zmq= finds nothing
// to subscribe to. A shipped manifest had done so.
func TestManifestsBindVLLMEventSockets(t *testing.T) {
	found := 0
	for _, d := range readManifests(t) {
		if !strings.Contains(d.text, "--kv-events-config") {
			continue
		}
		for _, m := range vllmEventEndpointRE.FindAllStringSubmatch(d.text, -1) {
			found++
			ep := m[1]
			if !strings.Contains(ep, "*") && !strings.Contains(ep, "::") && !strings.HasPrefix(ep, "ipc://") {
				t.Errorf("%s: vLLM event endpoint %q: vLLM connects out to it rather than bind it; give tcp://*:PORT", d.where, ep)
			}
		}
	}
	if found == 0 {
		t.Fatal("no vLLM event endpoint found in the manifests: the check reads nothing")
	}
}
