package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

func main() {
	out := flag.String("out", "", "directory to write the schemas to (created)")
	openapi := flag.String("openapi", "", "directory of Kubernetes' OpenAPI v3 documents (api/openapi-spec/v3)")
	strict := flag.Bool("strict", true, "refuse properties a schema does not list")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "usage: kubeschema -out DIR [-strict] [-openapi DIR] [CRD.yaml ...]")
		os.Exit(2)
	}
	n, err := run(*out, *openapi, flag.Args(), *strict)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeschema:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kubeschema: %d schemas in %s\n", n, *out)
}

func run(out, openapi string, crds []string, strict bool) (int, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return 0, fmt.Errorf("cannot create %s: %w", out, err)
	}
	n := 0
	if openapi != "" {
		k, err := writeOpenAPI(out, openapi, strict)
		if err != nil {
			return n, err
		}
		n += k
	}
	for _, f := range crds {
		k, err := writeCRDs(out, f, strict)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// fileName is kubeconform's name for a kind's schema: the kind in lower
// case, the group's first label (none for the core group), the version.
func fileName(group, version, kind string) string {
	s := strings.ToLower(kind)
	if group != "" {
		s += "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return s + "-" + strings.ToLower(version) + ".json"
}

// writeOpenAPI writes a schema for every kind the OpenAPI documents in
// dir define (x-kubernetes-group-version-kind).
func writeOpenAPI(out, dir string, strict bool) (int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		return 0, fmt.Errorf("cannot find OpenAPI documents in %s", dir)
	}
	defs := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, fmt.Errorf("cannot read %s: %w", f, err)
		}
		var doc struct {
			Components struct {
				Schemas map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return 0, fmt.Errorf("cannot decode %s: %w", f, err)
		}
		for k, v := range doc.Components.Schemas {
			defs[k] = v
		}
	}
	n := 0
	for name, def := range defs {
		m, _ := def.(map[string]any)
		gvks, _ := m["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) == 0 {
			continue
		}
		schema := inline(def, defs, map[string]bool{name: true}, strict)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			if err := write(out, fileName(group, version, kind), schema); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

const refPrefix = "#/components/schemas/"

// inline copies v with every $ref replaced by its definition. A ref
// already being inlined (a recursive type) becomes an open schema.
func inline(v any, defs map[string]any, stack map[string]bool, strict bool) any {
	switch t := v.(type) {
	case map[string]any:
		if ref, ok := t["$ref"].(string); ok && strings.HasPrefix(ref, refPrefix) {
			name := strings.TrimPrefix(ref, refPrefix)
			def, known := defs[name]
			if !known || stack[name] {
				return map[string]any{}
			}
			stack[name] = true
			r := inline(def, defs, stack, strict)
			delete(stack, name)
			return r
		}
		out := make(map[string]any, len(t))
		for k, e := range t {
			if k == "properties" {
				// Property names are not schema keywords: walk the values only.
				props, _ := e.(map[string]any)
				cp := make(map[string]any, len(props))
				for pk, pv := range props {
					cp[pk] = inline(pv, defs, stack, strict)
				}
				out[k] = cp
				continue
			}
			out[k] = inline(e, defs, stack, strict)
		}
		closeObject(out, strict)
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = inline(e, defs, stack, strict)
		}
		return out
	}
	return v
}

// closeObject makes an object schema that lists its properties refuse
// any other, unless it says what others may be or keeps unknown fields.
func closeObject(m map[string]any, strict bool) {
	if !strict {
		return
	}
	_, listed := m["properties"]
	_, open := m["additionalProperties"]
	if keep, _ := m["x-kubernetes-preserve-unknown-fields"].(bool); keep || !listed || open {
		return
	}
	m["additionalProperties"] = false
}

// writeCRDs writes a schema for every served version of every
// CustomResourceDefinition in the YAML file f.
func writeCRDs(out, f string, strict bool) (int, error) {
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, fmt.Errorf("cannot read %s: %w", f, err)
	}
	n := 0
	for i, doc := range strings.Split(string(b), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Served bool   `json:"served"`
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &crd); err != nil {
			return n, fmt.Errorf("cannot decode document %d of %s: %w", i, f, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			schema := inline(v.Schema.OpenAPIV3Schema, nil, map[string]bool{}, strict)
			if err := write(out, fileName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind), schema); err != nil {
				return n, err
			}
			n++
		}
	}
	if n == 0 {
		return 0, errors.New("no served CustomResourceDefinition version in " + f)
	}
	return n, nil
}

func write(dir, name string, schema any) error {
	b, err := json.Marshal(schema)
	if err != nil {
		return fmt.Errorf("cannot encode the schema %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		return fmt.Errorf("cannot write the schema %s: %w", name, err)
	}
	return nil
}
