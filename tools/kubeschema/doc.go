// Command kubeschema writes the JSON schemas kubeconform validates
// kvfast's Kubernetes manifests against, offline: from the OpenAPI v3
// documents the Kubernetes source ships (api/openapi-spec/v3 of the
// k8s.io/kubernetes module) and from CustomResourceDefinitions (the
// Gateway API's and the Inference Extension's, from their modules), both
// fetched through the Go module proxy at pinned versions by
// scripts/check-manifests.sh.
//
// Each kind becomes DIR/<kind><suffix>.json, the names kubeconform's
// -schema-location template {{ .ResourceKind }}{{ .KindSuffix }} asks
// for (deployment-apps-v1.json, httproute-gateway-v1.json), with every
// $ref inlined. With -strict, every object that lists its properties
// refuses others (as kubeconform's own -strict schemas do), so that a
// misspelt field fails; objects Kubernetes lets hold anything
// (x-kubernetes-preserve-unknown-fields) stay open.
//
// Usage: kubeschema -out DIR [-strict] [-openapi DIR] [CRD.yaml ...]
//
// It is a lint tool of this repository (tools/go.mod), not part of the
// router: one process, one goroutine, reading its inputs and writing its
// report; it owns nothing beyond its run.
package main
