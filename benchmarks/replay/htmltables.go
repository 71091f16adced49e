package replay

import (
	"io"
	"time"
)

// HTMLTable is a table a caller adds to the HTML report, below the
// summary: what its own experiment measured beside the replay (the demo's
// encoder-cache numbers, say). Cells are text, escaped as such.
type HTMLTable struct {
	Title, Note string
	Header      []string
	Rows        [][]string
}

// WriteHTMLTables is WriteHTML with tables added below the summary.
func WriteHTMLTables(w io.Writer, results []NamedResult, tables []HTMLTable) error {
	rep := buildHTMLReport(results, time.Now())
	rep.Tables = tables
	return reportTemplate.Execute(w, rep)
}
