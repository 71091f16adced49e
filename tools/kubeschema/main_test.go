package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestRun: kinds from an OpenAPI document and a CRD land under
// kubeconform's names, with refs inlined (a recursive one left open) and
// objects that list their properties closed, unless they keep unknown
// fields.
func TestRun(t *testing.T) {
	in := t.TempDir()
	doc := `{"components":{"schemas":{
	  "io.k8s.api.apps.v1.Deployment":{"type":"object","x-kubernetes-group-version-kind":[{"group":"apps","version":"v1","kind":"Deployment"}],
	    "properties":{"spec":{"allOf":[{"$ref":"#/components/schemas/io.k8s.api.apps.v1.Spec"}]}}},
	  "io.k8s.api.apps.v1.Spec":{"type":"object","properties":{"replicas":{"type":"integer"},"self":{"$ref":"#/components/schemas/io.k8s.api.apps.v1.Spec"}}},
	  "io.k8s.api.core.v1.Service":{"type":"object","x-kubernetes-group-version-kind":[{"group":"","version":"v1","kind":"Service"}],
	    "properties":{"spec":{"type":"object","x-kubernetes-preserve-unknown-fields":true,"properties":{"a":{"type":"string"}}}}}}}}`
	if err := os.WriteFile(filepath.Join(in, "apis__apps__v1_openapi.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: inference.networking.k8s.io
  names: {kind: InferencePool}
  versions:
  - name: v1
    served: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {selector: {type: object}}}
  - name: v1alpha1
    served: false
    schema: {openAPIV3Schema: {type: object}}
`
	crdFile := filepath.Join(in, "crd.yaml")
	if err := os.WriteFile(crdFile, []byte(crd), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	n, err := run(out, in, []string{crdFile}, true)
	if err != nil || n != 3 {
		t.Fatalf("run: %d schemas, %v; want 3", n, err)
	}
	read := func(name string) map[string]any {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	dep := read("deployment-apps-v1.json")
	spec := dep["properties"].(map[string]any)["spec"].(map[string]any)["allOf"].([]any)[0].(map[string]any)
	want := map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{
		"replicas": map[string]any{"type": "integer"}, "self": map[string]any{}}}
	if !reflect.DeepEqual(spec, want) || dep["additionalProperties"] != false {
		t.Errorf("deployment: %v", dep)
	}
	svc := read("service-v1.json")
	if _, closed := svc["properties"].(map[string]any)["spec"].(map[string]any)["additionalProperties"]; closed {
		t.Errorf("an object that keeps unknown fields was closed: %v", svc)
	}
	pool := read("inferencepool-inference-v1.json")
	if pool["additionalProperties"] != false {
		t.Errorf("inference pool not strict: %v", pool)
	}
	if _, err := os.Stat(filepath.Join(out, "inferencepool-inference-v1alpha1.json")); err == nil {
		t.Error("a version not served got a schema")
	}
}
