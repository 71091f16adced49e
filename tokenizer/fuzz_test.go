package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"
)

// fuzzFamilies are the tokenizers FuzzEncode checks each input with: one
// per split pattern and both SentencePiece designs.
var fuzzFamilies = []string{"llama3", "qwen3", "deepseek_v3", "gptoss", "claude", "llama2", "gemma3"}

var (
	fuzzTokenizers     map[string]*Tokenizer
	fuzzTokenizersOnce sync.Once
)

// FuzzEncode is the differential fuzz test: every input must encode to
// the reference's ids in every fuzzed family. Without the reference (no
// Node.js), it still checks that Encode is total and stable.
func FuzzEncode(f *testing.F) {
	for _, c := range generatedCases() {
		if len(c.text) < 256 {
			f.Add(c.text, true)
		}
	}
	for _, s := range []string{"Hello world", "it's 12345 <|im_start|>", "  \n\t x", "\xff\xfe", "é", "日本語 テキスト"} {
		f.Add([]byte(s), false)
	}
	var o *oracle
	if referenceMissing() == nil {
		o = getOracle(f)
	} else if _, err := os.Stat(familyDir(fuzzFamilies[0])); err != nil {
		f.Skip("the tokenizer.json files are missing; run scripts/setup-test-deps.sh")
	}
	fuzzTokenizersOnce.Do(func() {
		fuzzTokenizers = map[string]*Tokenizer{}
		for _, name := range fuzzFamilies {
			fuzzTokenizers[name] = loadFamily(f, o, name)
		}
	})
	f.Fuzz(func(t *testing.T, text []byte, addSpecial bool) {
		for _, name := range fuzzFamilies {
			tok := fuzzTokenizers[name]
			got := tok.Encode(nil, text, addSpecial)
			if again := tok.Encode(nil, text, addSpecial); !slices.Equal(got, again) {
				t.Fatalf("%s: Encode is not stable: %v then %v", name, got, again)
			}
			for _, id := range got {
				if int(id) >= tok.VocabSize() {
					t.Fatalf("%s: id %d is not below VocabSize %d", name, id, tok.VocabSize())
				}
			}
			if o == nil {
				continue
			}
			want, err := o.encode(name, [][]byte{text}, addSpecial)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want[0]) {
				t.Fatalf("%s addSpecial=%v: %s\n%s", name, addSpecial, excerpt(text), diffIDs(got, want[0]))
			}
		}
	})
}

// FuzzMatchers checks every hand-written split matcher against regexp2
// running the pattern it implements.
func FuzzMatchers(f *testing.F) {
	initClasses()
	patterns := []string{patternGPT2, patternCL100k, patternQwen, patternO200k, patternDeepSeekWords, patternDigits3, patternDeepSeekCJK}
	var generic []*regexpMatcher
	for _, p := range patterns {
		m, err := newRegexpMatcher(p)
		if err != nil {
			f.Fatal(err)
		}
		generic = append(generic, m)
	}
	for _, c := range generatedCases() {
		if len(c.text) < 512 {
			f.Add(c.text)
		}
	}
	files, _ := filepath.Glob("testdata/corpus/*")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 2000)])
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		if !utf8.Valid(text) {
			text = appendLossy(nil, text)
		}
		st := new(encodeState)
		for i, p := range patterns {
			hand, _ := handWritten(p)
			got := hand.appendMatches(st, text, nil)
			want := generic[i].appendMatches(st, text, nil)
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %d on %q:\nhand-written %v\nregexp2      %v", i, text, got, want)
			}
		}
	})
}

// FuzzNew feeds New mangled tokenizer.json files: it must return a
// tokenizer or an error, never panic, and a tokenizer it returns must
// encode anything.
func FuzzNew(f *testing.F) {
	seeds := []string{
		`{"version":"1.0","added_tokens":[{"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
		  "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
		  "pre_tokenizer":null,"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[3],"tokens":["<s>"]}}},
		  "model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"vocab":{"<unk>":0,"▁":1,"a":2,"<s>":3,"▁a":4,"<0x0A>":5},"merges":["▁ a"]}}`,
		`{"added_tokens":[],"normalizer":{"type":"NFC"},
		  "pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},
		  "post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},
		  "model":{"type":"BPE","ignore_merges":true,"vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":[["a","b"]]}}`,
		`{"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true},"model":{"vocab":{"▁":0,"x":1},"merges":[]}}`,
		`{"model":{"type":"WordPiece","vocab":{}}}`,
		`[]`, `null`, `{}`, ``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := New(data, data)
		if err != nil {
			return
		}
		for _, text := range []string{"", "a b\n<s>x", "\xff", "▁▁ab ba"} {
			ids := tok.Encode(nil, []byte(text), true)
			for _, id := range ids {
				if int(id) >= tok.VocabSize() {
					t.Fatalf("id %d is not below VocabSize %d", id, tok.VocabSize())
				}
			}
		}
	})
}
