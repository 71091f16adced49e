package replay

// HTMLTable is a table a caller adds to the HTML report, below the
// summary: what its own experiment measured beside the replay (the demo's
// encoder-cache numbers, say). Cells are text, escaped as such.
type HTMLTable struct {
	Title, Note string
	Header      []string
	Rows        [][]string
}
