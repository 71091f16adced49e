package replay

import (
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// element is one parsed start tag with its attributes and position.
type element struct {
	name  string
	attrs map[string]string
	depth int
	path  []string // class attributes of the enclosing elements
}

// parseXHTML parses the report strictly as XML, which the HTML5 it writes
// is meant to be, and returns every element in document order.
func parseXHTML(t *testing.T, doc string) []element {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(doc))
	d.Strict = true
	var (
		out   []element
		stack []string
	)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("report is not well-formed: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{name: tok.Name.Local, attrs: map[string]string{}, depth: len(stack), path: append([]string(nil), stack...)}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			stack = append(stack, e.attrs["class"])
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) != 0 {
		t.Fatalf("%d unclosed elements", len(stack))
	}
	return out
}

func TestWriteHTML(t *testing.T) {
	results := []NamedResult{
		{"kv", fakeResult([]float64{5, 8, 12, 30, 31, 2000}, 60, 100, 0)},
		{`round-robin <&"'>`, fakeResult([]float64{50, 80, 120, 300}, 10, 100, 1)},
		{"all failed", fakeResult(nil, 0, 0, 3)},
	}
	var b strings.Builder
	if err := WriteHTML(&b, results); err != nil {
		t.Fatal(err)
	}
	doc := b.String()
	if !strings.HasPrefix(doc, "<!DOCTYPE html>") {
		t.Fatal("no doctype")
	}
	for _, banned := range []string{"<script", "<link", "src=", "href=", "ZgotmplZ", "@import"} {
		if strings.Contains(doc, banned) {
			t.Fatalf("report contains %q: it must be self-contained and cleanly escaped", banned)
		}
	}
	els := parseXHTML(t, doc)

	var figures, curves, hitBars, rows []element
	for _, e := range els {
		switch {
		case e.name == "figure" && e.attrs["class"] == "cdf":
			figures = append(figures, e)
		case e.name == "path" && e.attrs["class"] == "cdf-curve":
			curves = append(curves, e)
		case e.name == "g" && e.attrs["class"] == "hit-bar":
			hitBars = append(hitBars, e)
		case e.name == "tr" && len(e.path) > 0 && e.path[len(e.path)-1] == "":
			rows = append(rows, e)
		}
	}
	if len(figures) != len(results) || len(hitBars) != len(results) {
		t.Fatalf("%d CDF figures and %d hit bars for %d results", len(figures), len(hitBars), len(results))
	}
	for i, f := range figures {
		if f.attrs["data-policy"] != results[i].Name || hitBars[i].attrs["data-policy"] != results[i].Name {
			t.Errorf("figure %d is for %q, bar for %q, want %q", i, f.attrs["data-policy"], hitBars[i].attrs["data-policy"], results[i].Name)
		}
	}
	// One curve per policy that has a successful request, each inside a
	// cdf figure and drawn with its own colour.
	if len(curves) != 2 {
		t.Fatalf("%d CDF curves, want 2", len(curves))
	}
	for _, c := range curves {
		if !slices.Contains(c.path, "cdf") || c.attrs["stroke"] == "" || !strings.HasPrefix(c.attrs["d"], "M") {
			t.Errorf("curve %+v", c)
		}
	}
	if n := strings.Count(curves[0].attrs["d"], " H"); n != 6 {
		t.Errorf("kv curve has %d steps, want one per request (6)", n)
	}
	if len(rows) != 1+len(results) {
		t.Errorf("%d table rows, want a header and %d", len(rows), len(results))
	}
}

func TestCDFPathThinning(t *testing.T) {
	r := fakeResult(nil, 0, 0, 0)
	for i := range 5000 {
		r.Requests = append(r.Requests, RequestResult{Attempted: true, TTFT: time.Millisecond + time.Duration(i)*time.Microsecond})
	}
	ax := logAxis{lo: 0, hi: 1, left: cdfLeft, right: cdfWidth - cdfRight}
	p := cdfPath(r.TTFTs(), ax)
	if n := strings.Count(p, " H"); n != cdfMaxPoints {
		t.Fatalf("%d steps, want %d", n, cdfMaxPoints)
	}
	if !strings.HasSuffix(p, "V14.0") { // the last step reaches 1.0 at the plot top
		t.Fatalf("path ends %q", p[len(p)-20:])
	}
}
