//go:build race

package tokenizer

// raceEnabled lets the heaviest differential tests cover fewer families
// under the race detector, which slows the Go side several times over.
const raceEnabled = true
