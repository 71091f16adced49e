// Package deploy holds what operators run kvfast with, beside the binary:
// the Prometheus rules (prometheus/), the Grafana dashboard (grafana/), the
// systemd units (systemd/: the router and one engine per GPU) and the
// Kubernetes manifests (kubernetes/); the container image is the
// repository's Dockerfile. docs/deploy.md explains them.
//
// # Responsibility
//
// It has no Go code of its own: its tests keep the files honest. The
// rules pass promtool (check and unit tests), the dashboard has the shape
// Grafana imports and valid PromQL, and every metric either of them names
// is one a running router exports. The Kubernetes manifests' kvfast
// containers, found by what they run, keep the image name that
// cmd/kvfast's flag check looks for, run the node's copy, get a
// termination grace period longer than the drain, and roll out with
// strategies that can finish; the systemd units pass systemd-analyze.
//
// # Ownership and concurrency
//
// Nothing runs here; the tests start a router (internal/rig) and stop it.
package deploy
