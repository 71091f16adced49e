package tokenizer

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// corpusCase is one text of the exactness corpus.
type corpusCase struct {
	name string
	text []byte
}

// corpus is the exactness corpus: the files under testdata/corpus, whole
// and paragraph by paragraph, and generated texts for what prose lacks:
// whitespace runs, special-token text inside content, invalid UTF-8 and
// very long inputs.
func corpus(t testing.TB) []corpusCase {
	t.Helper()
	var cases []corpusCase
	files, err := filepath.Glob("testdata/corpus/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus files: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		cases = append(cases, corpusCase{name, b})
		for i, para := range bytes.Split(b, []byte("\n\n")) {
			cases = append(cases, corpusCase{fmt.Sprintf("%s#%d", name, i), para})
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			if i%7 == 0 {
				cases = append(cases, corpusCase{fmt.Sprintf("%s:%d", name, i+1), line})
			}
		}
	}
	return append(cases, generatedCases()...)
}

func generatedCases() []corpusCase {
	var cases []corpusCase
	add := func(name, text string) { cases = append(cases, corpusCase{name, []byte(text)}) }

	add("empty", "")
	for _, ws := range []string{" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", " \n", "\n ", "\t\n", "\r"} {
		for _, n := range []int{1, 2, 3, 4, 7, 16, 33} {
			run := strings.Repeat(ws, n)
			add(fmt.Sprintf("ws%q*%d", ws, n), run)
			add(fmt.Sprintf("a%q*%db", ws, n), "a"+run+"b")
			add(fmt.Sprintf("x.%q*%d", ws, n), "x."+run)
			add(fmt.Sprintf("%q*%d.y", ws, n), run+".y")
		}
	}
	add("mixed-ws", "a \t \n\n  \r\n\t\tb  \n  c\n\n\n   d \u3000 e\u00a0\u00a0f   ")
	add("digits", "0 01 012 0123 01234 012345 0123456 01234567 x1y22z333w4444 ١٢٣٤٥ 12.5% v1.2.3")
	add("contractions", "I'm you're he's she'd we'll they've it'S I'M YOU'RE 'tis 'twas rock'n'roll '' ''' 's 'S x's")
	add("odd-case", "it'ſ IT'ſ Ǆ ǅ ǆ ΣΑΣ σας ﬅ ﬆ ẞ İı K Å")

	// Special-token text inside user content: every family's markup, and
	// near misses.
	specials := []string{
		"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>",
		"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
		"<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>",
		"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>",
		"<|fim_prefix|>", "<|reserved_special_token_0|>", "<image_soft_token>", "<mask>",
	}
	for _, s := range specials {
		add("special "+s, s)
		add("special-in "+s, "Hello "+s+"world "+s+" "+s+s+"\n"+s+"\n")
		add("special-near "+s, "<"+s+">"+s[:len(s)-1]+" "+s[1:]+" x"+s+"y")
	}
	add("chat-llama3", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
	add("chat-qwen", "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHello! <think>hmm</think>\n<|im_end|>\n<|im_start|>assistant\n")
	add("chat-mistral", "<s>[INST] What is your favourite condiment? [/INST]Well, I'm quite partial to a good squeeze of fresh lemon juice.</s> [INST] Do you have mayonnaise recipes? [/INST]")
	add("chat-gemma", "<bos><start_of_turn>user\nWrite a poem<end_of_turn>\n<start_of_turn>model\n")

	// Invalid UTF-8, read as a WHATWG decoder reads it.
	for i, s := range []string{
		"\xff", "a\xffb", "\xe2\x82", "\xe2\x82x", "\xe2\x82\xac", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"\xf0\x9f\x98", "\xc0\xaf", "\x80\x80\x80", "ok \xf0\x9f\x98 emoji \xf0\x9f\x98\x80 \xfe\xfe", "<|im_start|>\xff<|im_end|>",
	} {
		add(fmt.Sprintf("invalid-utf8-%d", i), s)
	}

	// Very long inputs.
	var long strings.Builder
	for i := 0; long.Len() < 200_000; i++ {
		fmt.Fprintf(&long, "Sentence %d: the quick brown fox jumps over the lazy dog; 快速的棕色狐狸 %d. ", i, i*i)
		if i%13 == 0 {
			long.WriteString("\n\n")
		}
	}
	add("long-prose", long.String())
	add("long-spaces", strings.Repeat(" ", 20_000)+"x")
	add("long-newlines", strings.Repeat("\n", 5_000)+"x"+strings.Repeat("\r\n", 3_000))
	add("long-word", strings.Repeat("abcdefghij", 3_000))
	add("long-digits", strings.Repeat("1234567890", 2_000))
	add("long-cjk", strings.Repeat("人工智能正在改变世界大型语言模型", 800))
	add("long-emoji", strings.Repeat("😀👍🏽👨‍👩‍👧‍👦", 1_500))
	add("long-punct", strings.Repeat("!?.,;:-_=+*/\\|", 1_500))
	add("long-arabic", strings.Repeat("مرحبا بالعالم ", 2_000))
	return cases
}

// TestExactAgainstReference is the exactness test: for every family, every
// corpus text must encode to the reference's ids, with and without the
// post-processor's special tokens.
func TestExactAgainstReference(t *testing.T) {
	skipUnderRace(t)
	o := getOracle(t)
	cases := corpus(t)
	texts := make([][]byte, len(cases))
	for i, c := range cases {
		texts[i] = c.text
	}
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			tok := loadFamily(t, o, fam.name)
			for _, addSpecial := range []bool{false, true} {
				want, err := o.encode(fam.name, texts, addSpecial)
				if err != nil {
					t.Fatal(err)
				}
				failures := 0
				for i, c := range cases {
					got := tok.Encode(nil, c.text, addSpecial)
					if !slices.Equal(got, want[i]) {
						failures++
						if failures <= 5 {
							t.Errorf("%s addSpecial=%v: %s\n%s", c.name, addSpecial, excerpt(c.text), diffIDs(got, want[i]))
						}
					}
				}
				t.Logf("%s (%s) addSpecial=%v: %d/%d texts exact", fam.name, fam.kind, addSpecial, len(cases)-failures, len(cases))
			}
		})
	}
}

func excerpt(b []byte) string {
	if len(b) > 120 {
		return fmt.Sprintf("%q… (%d bytes)", b[:120], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// diffIDs shows where two id lists part.
func diffIDs(got, want []uint32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-3)
	return fmt.Sprintf("first difference at %d of %d/%d: got …%v… want …%v…", i, len(got), len(want),
		got[lo:min(len(got), i+6)], want[lo:min(len(want), i+6)])
}
