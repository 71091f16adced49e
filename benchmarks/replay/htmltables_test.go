package replay

import (
	"strings"
	"testing"
)

// TestWriteHTMLWithTables: a caller's table is written below the summary,
// escaped, and the page stays well-formed.
func TestWriteHTMLWithTables(t *testing.T) {
	results := []NamedResult{{"kv", fakeResult([]float64{5, 8}, 60, 100, 0)}}
	tables := []HTMLTable{{Title: "Encoders <1>", Note: "a & b", Header: []string{"run", "hit rate"},
		Rows: [][]string{{"kv 2E", "0.5"}, {`by "load"`, "0.3"}}}}
	var b strings.Builder
	if err := WriteHTMLWith(&b, results, nil, tables); err != nil {
		t.Fatal(err)
	}
	doc := b.String()
	var cells []string
	for _, e := range parseXHTML(t, doc) {
		if e.name == "table" {
			cells = append(cells, e.attrs["class"])
		}
	}
	if strings.Join(cells, ",") != "summary,extra" {
		t.Errorf("tables %v, want the summary then the caller's", cells)
	}
	for _, want := range []string{"<h2>Encoders &lt;1&gt;</h2>", "a &amp; b", "<th>hit rate</th>", "<td>by &#34;load&#34;</td>", "<td>0.3</td>"} {
		if !strings.Contains(doc, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Index(doc, "Encoders") > strings.Index(doc, "Prefix hit rate") {
		t.Error("the caller's table is not below the summary")
	}
}
