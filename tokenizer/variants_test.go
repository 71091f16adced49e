package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// variant is a real tokenizer.json with components swapped, to check
// against the reference what no shipped family uses: other pre-tokenizers,
// normalizers, post-processors, added-token flags and merge shapes.
type variant struct {
	name   string
	base   string // the family whose tokenizer.json is changed
	change func(f map[string]any)
}

func raw(s string) any {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		panic(err)
	}
	return v
}

func addedTokens(f map[string]any, tokens ...string) {
	list, _ := f["added_tokens"].([]any)
	for _, t := range tokens {
		list = append(list, raw(t))
	}
	f["added_tokens"] = list
}

func variants() []variant {
	var vs []variant
	for _, scheme := range []string{"always", "first", "never"} {
		for _, split := range []bool{true, false} {
			vs = append(vs, variant{fmt.Sprintf("metaspace-%s-split=%v", scheme, split), "llama2", func(f map[string]any) {
				f["normalizer"] = nil
				f["pre_tokenizer"] = raw(fmt.Sprintf(`{"type":"Metaspace","replacement":"▁","prepend_scheme":%q,"split":%v}`, scheme, split))
			}})
		}
	}
	for _, behavior := range []string{"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"} {
		for _, invert := range []bool{false, true} {
			vs = append(vs, variant{fmt.Sprintf("split-%s-invert=%v", behavior, invert), "claude", func(f map[string]any) {
				f["pre_tokenizer"] = raw(fmt.Sprintf(`{"type":"Sequence","pretokenizers":[
					{"type":"Split","pattern":{"Regex":"\\p{N}+|[,.!?]"},"behavior":%q,"invert":%v},
					{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]}`, behavior, invert))
			}})
		}
	}
	vs = append(vs,
		variant{"bytelevel-prefix-regex", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}`)
		}},
		variant{"bytelevel-missing-field", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"ByteLevel","add_prefix_space":true}`)
		}},
		variant{"bytelevel-no-regex", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]}`)
		}},
		variant{"digits-individual", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false}]}`)
		}},
		variant{"digits-contiguous-delimiter", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":false},{"type":"CharDelimiterSplit","delimiter":"e"},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false}]}`)
		}},
		variant{"split-literal-regexp2", "claude", func(f map[string]any) {
			f["pre_tokenizer"] = raw(`{"type":"Sequence","pretokenizers":[
				{"type":"Split","pattern":{"String":"the"},"behavior":"MergedWithNext","invert":false},
				{"type":"Split","pattern":{"Regex":"(?<=a)b|\\s+(?=[A-Z])"},"behavior":"Isolated","invert":false},
				{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}]}`)
		}},
		variant{"normalizers", "claude", func(f map[string]any) {
			f["normalizer"] = raw(`{"type":"Sequence","normalizers":[{"type":"NFD"},{"type":"StripAccents"},{"type":"Lowercase"},
				{"type":"Strip","strip_left":true,"strip_right":true},{"type":"Replace","pattern":{"Regex":"\\s{2,}"},"content":" "},
				{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Prepend","prepend":"#"}]}]}`)
		}},
		variant{"nfkd-replace-string", "llama2", func(f map[string]any) {
			f["normalizer"] = raw(`{"type":"Sequence","normalizers":[{"type":"NFKD"},{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`)
		}},
		variant{"template-bos-eos", "llama2", func(f map[string]any) {
			f["post_processor"] = raw(`{"type":"Sequence","processors":[{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},
				{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],
				"pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
				"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[2],"tokens":["</s>"]}}}]}`)
		}},
		variant{"roberta", "claude", func(f map[string]any) {
			f["post_processor"] = raw(`{"type":"RobertaProcessing","sep":["</s>",2],"cls":["<s>",0],"trim_offsets":true,"add_prefix_space":false}`)
		}},
		variant{"added-flags", "llama2", func(f map[string]any) {
			addedTokens(f,
				`{"id":32000,"content":"<mask>","single_word":false,"lstrip":true,"rstrip":false,"normalized":false,"special":true}`,
				`{"id":32001,"content":"<sep>","single_word":false,"lstrip":false,"rstrip":true,"normalized":false,"special":true}`,
				`{"id":32002,"content":"cat","single_word":true,"lstrip":false,"rstrip":false,"normalized":false,"special":false}`,
				`{"id":32003,"content":" dog","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false}`,
				`{"id":32004,"content":"ab","single_word":false,"lstrip":true,"rstrip":true,"normalized":true,"special":false}`,
				`{"id":32005,"content":"abc","single_word":true,"lstrip":false,"rstrip":false,"normalized":false,"special":false}`,
				`{"id":7,"content":"Hello","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}`)
		}},
		variant{"merges-as-strings", "gemma3", func(f map[string]any) {
			model := f["model"].(map[string]any)
			merges := model["merges"].([]any)
			lines := make([]any, 0, len(merges))
			for _, m := range merges {
				pair := m.([]any)
				if strings.Contains(pair[0].(string), " ") || strings.Contains(pair[1].(string), " ") {
					continue
				}
				lines = append(lines, pair[0].(string)+" "+pair[1].(string))
			}
			model["merges"] = lines
		}},
		variant{"merges-as-pairs", "llama3", func(f map[string]any) {
			model := f["model"].(map[string]any)
			merges := model["merges"].([]any)
			pairs := make([]any, len(merges))
			for i, m := range merges {
				a, b, _ := strings.Cut(m.(string), " ")
				pairs[i] = []any{a, b}
			}
			model["merges"] = pairs
			model["ignore_merges"] = false
		}},
		variant{"unk-no-fallback", "llama2", func(f map[string]any) {
			model := f["model"].(map[string]any)
			model["byte_fallback"] = false
			model["fuse_unk"] = true
		}},
		variant{"unk-no-fuse", "llama2", func(f map[string]any) {
			model := f["model"].(map[string]any)
			model["byte_fallback"] = false
			model["fuse_unk"] = false
		}},
		variant{"no-unk-no-fallback", "llama2", func(f map[string]any) {
			model := f["model"].(map[string]any)
			model["byte_fallback"] = false
			model["unk_token"] = nil
		}},
		variant{"subword-prefix-suffix", "llama2", func(f map[string]any) {
			// Empty affixes are what real files carry; the merges must
			// still build.
			model := f["model"].(map[string]any)
			model["continuing_subword_prefix"] = ""
			model["end_of_word_suffix"] = ""
		}},
	)
	return vs
}

// TestVariantsAgainstReference checks each variant on a slice of the
// corpus; a variant the reference refuses to load must be refused here too.
func TestVariantsAgainstReference(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("loads many tokenizers")
	}
	o := getOracle(t)
	var cases []corpusCase
	for i, c := range corpus(t) {
		if len(c.text) < 4000 && i%3 == 0 {
			cases = append(cases, c)
		}
	}
	cases = append(cases,
		corpusCase{"flags", []byte("a <mask> b<mask>c  <mask>  <sep>  x<sep>y cat concat cat. the dog hot dog ab  ab xaby abc abcd Hello HelloHello")},
		corpusCase{"digits", []byte("In 2024, 1,234.56 people paid $99.99; e-mail me: test1e5@example.com 😀1️⃣")},
	)
	texts := make([][]byte, len(cases))
	for i, c := range cases {
		texts[i] = c.text
	}
	bases := map[string]map[string]any{}
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			if bases[v.base] == nil {
				b, err := os.ReadFile(filepath.Join(familyDir(v.base), "tokenizer.json"))
				if err != nil {
					t.Fatal(err)
				}
				var f map[string]any
				if err := json.Unmarshal(b, &f); err != nil {
					t.Fatal(err)
				}
				bases[v.base] = f
			}
			f := map[string]any{}
			for k, val := range bases[v.base] {
				f[k] = val
			}
			model := map[string]any{}
			for k, val := range bases[v.base]["model"].(map[string]any) {
				model[k] = val
			}
			f["model"] = model
			v.change(f)
			b, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			refErr := o.loadJSON("variant", b)
			tok, err := New(b, nil)
			if refErr != nil {
				if err == nil {
					t.Fatalf("the reference refuses the variant (%v), New accepts it", refErr)
				}
				t.Logf("both refuse: reference %v; New %v", refErr, err)
				return
			}
			if err != nil {
				t.Fatalf("New: %v (the reference loads it)", err)
			}
			for _, addSpecial := range []bool{false, true} {
				want, err := o.encode("variant", texts, addSpecial)
				if err != nil {
					t.Fatal(err)
				}
				failures := 0
				for i, c := range cases {
					if got := tok.Encode(nil, c.text, addSpecial); !slices.Equal(got, want[i]) {
						failures++
						if failures <= 3 {
							t.Errorf("%s addSpecial=%v: %s\n%s", c.name, addSpecial, excerpt(c.text), diffIDs(got, want[i]))
						}
					}
				}
			}
		})
	}
}
