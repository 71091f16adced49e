//go:build race

package tokenizer

// raceEnabled makes the differential tests skip under the race detector
// (skipUnderRace).
const raceEnabled = true
