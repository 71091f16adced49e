package tokenizer

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// benchCorpus is what BenchmarkTokenize encodes and what
// testdata/reference/bench.mjs times HF tokenizers on: every file under
// testdata/corpus, each split into paragraphs (a prompt-sized unit).
func benchCorpus(b *testing.B) [][]byte {
	b.Helper()
	files, err := filepath.Glob("testdata/corpus/*")
	if err != nil || len(files) == 0 {
		b.Fatalf("no corpus files: %v", err)
	}
	var texts [][]byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		for _, para := range bytes.Split(data, []byte("\n\n")) {
			if len(para) > 0 {
				texts = append(texts, para)
			}
		}
	}
	return texts
}

// BenchmarkTokenize encodes the benchmark corpus with each family's
// tokenizer, single-threaded, reporting tokens/s.
func BenchmarkTokenize(b *testing.B) {
	texts := benchCorpus(b)
	var size int
	for _, t := range texts {
		size += len(t)
	}
	for _, fam := range families {
		b.Run(fam.name, func(b *testing.B) {
			if err := referenceMissing(); err != nil {
				b.Skipf("the reference files are missing (%v); run scripts/setup-test-deps.sh", err)
			}
			tok := loadFamily(b, nil, fam.name)
			dst := make([]uint32, 0, 1<<16)
			tokens := 0
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for _, t := range texts {
					dst = tok.Encode(dst[:0], t, false)
					tokens += len(dst)
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
