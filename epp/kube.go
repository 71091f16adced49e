package epp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kube lists the ready pods an InferencePool selects, through the
// Kubernetes API server, with plain HTTPS and the pod's service-account
// token: two GETs per poll (the pool, then its pods), which a fake API
// server answers in tests. The service account needs get on
// inferencepools and list on pods in the pool's namespace
// (deploy/kubernetes has the Role).
type Kube struct {
	// APIServer is the API server's base URL (https://host:port).
	APIServer string
	// TokenFile holds the bearer token, read again at every poll because
	// projected tokens rotate; "" sends none.
	TokenFile string
	// Namespace and Pool name the InferencePool.
	Namespace, Pool string
	// EventsPort is the port of every pod's ZMQ KV-event socket (vLLM's
	// --kv-events-config endpoint, tcp://*:5557 by default) for the engine
	// at the pool's first target port, EventsPort+i for the i-th; 0: the
	// pods publish none. ReplayPort is the replay socket's, 0 for none.
	EventsPort, ReplayPort int
	// Client makes the requests; InCluster sets one that trusts the
	// cluster's CA.
	Client *http.Client
}

// The in-cluster service-account files.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// InCluster is Kube for the pool named pool, in namespace (or, if "", the
// picker's own), from inside a pod: the API server from the environment
// Kubernetes sets, the token and CA its service account mounts.
func InCluster(namespace, pool string) (*Kube, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("cannot find the API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset (not in a pod?)")
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("cannot read the cluster's CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("cannot use the cluster's CA: no certificate in %s/ca.crt", serviceAccountDir)
	}
	if namespace == "" {
		ns, err := os.ReadFile(serviceAccountDir + "/namespace")
		if err != nil {
			return nil, fmt.Errorf("cannot learn the picker's namespace: %w", err)
		}
		namespace = strings.TrimSpace(string(ns))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &Kube{APIServer: "https://" + net.JoinHostPort(host, port), TokenFile: serviceAccountDir + "/token",
		Namespace: namespace, Pool: pool, Client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

// maxTargetPorts is the most target ports an InferencePool lists (its CRD's
// maxItems).
const maxTargetPorts = 8

// The parts of the objects the picker reads.
type (
	inferencePool struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			TargetPorts []struct {
				Number int `json:"number"`
			} `json:"targetPorts"`
		} `json:"spec"`
	}
	podList struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Status struct {
				PodIP      string `json:"podIP"`
				Conditions []struct {
					Type   string `json:"type"`
					Status string `json:"status"`
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
)

// Endpoints lists the pool's ready pods, each at each of the pool's target
// ports: the InferencePool treats every port as an endpoint of its own (a
// data-parallel rank's server, up to 8), and the i-th port's engine
// publishes its KV events on EventsPort+i (ReplayPort+i), as vLLM offsets
// its event sockets by the rank. A pod being deleted, without an IP yet,
// or not Ready is left out: the picker routes only where the gateway can
// forward.
func (k *Kube) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var pool inferencePool
	if err := k.get(ctx, "/apis/inference.networking.k8s.io/v1/namespaces/"+url.PathEscape(k.Namespace)+
		"/inferencepools/"+url.PathEscape(k.Pool), nil, &pool); err != nil {
		return nil, err
	}
	if len(pool.Spec.TargetPorts) == 0 || len(pool.Spec.Selector.MatchLabels) == 0 {
		return nil, fmt.Errorf("cannot route for InferencePool %s/%s: it has no target port or no selector", k.Namespace, k.Pool)
	}
	if len(pool.Spec.TargetPorts) > maxTargetPorts {
		// The CRD allows 8; more is an API server that does not check it.
		return nil, fmt.Errorf("cannot route for InferencePool %s/%s: it lists %d target ports, more than the %d the InferencePool allows",
			k.Namespace, k.Pool, len(pool.Spec.TargetPorts), maxTargetPorts)
	}
	for _, tp := range pool.Spec.TargetPorts {
		if tp.Number < 1 || tp.Number > 65535 {
			return nil, fmt.Errorf("cannot route for InferencePool %s/%s: target port %d is not a port", k.Namespace, k.Pool, tp.Number)
		}
	}
	if last := len(pool.Spec.TargetPorts) - 1; max(k.EventsPort, k.ReplayPort)+last > 65535 {
		return nil, fmt.Errorf("cannot route for InferencePool %s/%s: its %d target ports put the event sockets past port 65535 (--events-port %d, --replay-port %d)",
			k.Namespace, k.Pool, last+1, k.EventsPort, k.ReplayPort)
	}
	var sel []string
	for key, v := range pool.Spec.Selector.MatchLabels {
		sel = append(sel, key+"="+v)
	}
	slices.Sort(sel)
	var pods podList
	if err := k.get(ctx, "/api/v1/namespaces/"+url.PathEscape(k.Namespace)+"/pods",
		url.Values{"labelSelector": {strings.Join(sel, ",")}}, &pods); err != nil {
		return nil, err
	}
	var eps []Endpoint
	for _, pod := range pods.Items {
		ready := false
		for _, c := range pod.Status.Conditions {
			ready = ready || (c.Type == "Ready" && c.Status == "True")
		}
		if !ready || pod.Status.PodIP == "" || pod.Metadata.DeletionTimestamp != nil {
			continue
		}
		for i, tp := range pool.Spec.TargetPorts {
			e := Endpoint{Address: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(tp.Number)), Name: pod.Metadata.Name}
			if len(pool.Spec.TargetPorts) > 1 {
				e.Name += ":" + strconv.Itoa(tp.Number)
			}
			if k.EventsPort > 0 {
				e.Events = "tcp://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(k.EventsPort+i))
				if k.ReplayPort > 0 {
					e.Replay = "tcp://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(k.ReplayPort+i))
				}
			}
			eps = append(eps, e)
		}
	}
	return eps, nil
}

// get reads one API object into v.
func (k *Kube) get(ctx context.Context, path string, query url.Values, v any) error {
	status, body, err := k.call(ctx, http.MethodGet, path, query, nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("cannot get %s: the API server answered %d: %s", path, status, firstLine(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("cannot decode the API server's answer for %s: %w", path, err)
	}
	return nil
}

// call makes one request of the API server, with in (if not nil) as its
// JSON body, and returns the answer's status and body.
func (k *Kube) call(ctx context.Context, method, path string, query url.Values, in any) (int, []byte, error) {
	u := strings.TrimSuffix(k.APIServer, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, fmt.Errorf("cannot encode a request for %s: %w", path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("cannot ask the API server for %s: %w", path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if k.TokenFile != "" {
		tok, err := os.ReadFile(k.TokenFile)
		if err != nil {
			return 0, nil, fmt.Errorf("cannot read the service-account token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	client := k.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("cannot ask the API server for %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("cannot read the API server's answer for %s: %w", path, err)
	}
	return resp.StatusCode, body, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
