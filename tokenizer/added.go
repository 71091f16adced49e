package tokenizer

import (
	"fmt"
	"sort"
)

// addedToken is one of tokenizer.json's added_tokens, with the id the
// model's own loader gives it.
type addedToken struct {
	content    string
	id         uint32
	special    bool
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
}

// addedMatch is a stretch of text and, when it is an added token, its id
// (token >= 0).
type addedMatch struct {
	start, end int
	token      int64
}

// tokenTrie finds added tokens in text, leftmost first and longest at a
// position, as the model's Aho-Corasick automaton (LeftmostLongest) does.
type tokenTrie struct {
	root   [256]int32 // child of the root for each byte, -1 when none
	nodes  []trieNode
	edges  []trieEdge
	tokens []addedToken // by trie terminal
}

type trieNode struct {
	firstEdge, numEdges int32
	terminal            int32 // index into tokens, -1 when none
}

type trieEdge struct {
	b     byte
	child int32
}

// buildTrie indexes tokens by pattern (which, for normalized tokens, is
// their normalized content).
func buildTrie(tokens []addedToken, patterns []string) (*tokenTrie, error) {
	type buildNode struct {
		children map[byte]int
		terminal int
	}
	nodes := []buildNode{{children: map[byte]int{}, terminal: -1}}
	for i, p := range patterns {
		if p == "" {
			return nil, fmt.Errorf("cannot index added token %q: its pattern is empty", tokens[i].content)
		}
		n := 0
		for k := 0; k < len(p); k++ {
			child, ok := nodes[n].children[p[k]]
			if !ok {
				child = len(nodes)
				nodes = append(nodes, buildNode{children: map[byte]int{}, terminal: -1})
				nodes[n].children[p[k]] = child
			}
			n = child
		}
		if nodes[n].terminal >= 0 {
			return nil, fmt.Errorf("cannot index added tokens %q and %q: they match the same text", tokens[nodes[n].terminal].content, tokens[i].content)
		}
		nodes[n].terminal = i
	}
	t := &tokenTrie{tokens: tokens, nodes: make([]trieNode, len(nodes))}
	for i := range t.root {
		t.root[i] = -1
	}
	for i, bn := range nodes {
		keys := make([]int, 0, len(bn.children))
		for b := range bn.children {
			keys = append(keys, int(b))
		}
		sort.Ints(keys)
		t.nodes[i] = trieNode{firstEdge: int32(len(t.edges)), numEdges: int32(len(keys)), terminal: int32(bn.terminal)}
		for _, b := range keys {
			t.edges = append(t.edges, trieEdge{b: byte(b), child: int32(bn.children[byte(b)])})
			if i == 0 {
				t.root[b] = int32(bn.children[byte(b)])
			}
		}
	}
	return t, nil
}

func (t *tokenTrie) child(n int32, b byte) int32 {
	node := t.nodes[n]
	edges := t.edges[node.firstEdge : node.firstEdge+node.numEdges]
	if len(edges) <= 8 {
		for _, e := range edges {
			if e.b == b {
				return e.child
			}
		}
		return -1
	}
	lo, hi := 0, len(edges)
	for lo < hi {
		mid := (lo + hi) / 2
		if edges[mid].b < b {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(edges) && edges[lo].b == b {
		return edges[lo].child
	}
	return -1
}

// next finds the leftmost match at or after pos, and the longest there.
func (t *tokenTrie) next(s []byte, pos int) (start, end, token int) {
	for i := pos; i < len(s); i++ {
		n := t.root[s[i]]
		if n < 0 {
			continue
		}
		best, bestEnd := -1, 0
		for k := i; ; {
			if term := t.nodes[n].terminal; term >= 0 {
				best, bestEnd = int(term), k+1
			}
			k++
			if k >= len(s) {
				break
			}
			if n = t.child(n, s[k]); n < 0 {
				break
			}
		}
		if best >= 0 {
			return i, bestEnd, best
		}
	}
	return -1, -1, -1
}

// appendMatches splits s at the added tokens it holds, with their
// single_word, lstrip and rstrip rules, as AddedVocabulary::find_matches
// does: gaps have token -1.
func (t *tokenTrie) appendMatches(s []byte, out []addedMatch) []addedMatch {
	if t == nil || len(s) == 0 {
		return append(out, addedMatch{0, len(s), -1})
	}
	startOffset := 0
	for pos := 0; pos < len(s); {
		start, end, idx := t.next(s, pos)
		if idx < 0 {
			break
		}
		// The automaton resumes after the raw match, whatever the
		// stripping below makes of it.
		pos = end
		tok := &t.tokens[idx]
		if tok.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := end == len(s) || !startsWithWord(s[end:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.lstrip {
			newStart := trailingSpaceStart(s[:start])
			start = max(newStart, startOffset)
		}
		if tok.rstrip {
			end += leadingSpaceEnd(s[end:])
		}
		if startOffset < start {
			out = append(out, addedMatch{startOffset, start, -1})
		}
		out = append(out, addedMatch{start, end, int64(tok.id)})
		startOffset = end
	}
	if startOffset != len(s) {
		out = append(out, addedMatch{startOffset, len(s), -1})
	}
	return out
}

func endsWithWord(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	start := lastRuneStart(s, len(s))
	c, _ := classAt(s, start)
	return c&clWord != 0
}

func startsWithWord(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	c, _ := classAt(s, 0)
	return c&clWord != 0
}

// trailingSpaceStart is where the whitespace that ends s begins.
func trailingSpaceStart(s []byte) int {
	end := len(s)
	for end > 0 {
		start := lastRuneStart(s, end)
		if c, _ := classAt(s, start); c&clSpace == 0 {
			break
		}
		end = start
	}
	return end
}

// leadingSpaceEnd is where the whitespace that starts s ends.
func leadingSpaceEnd(s []byte) int {
	return runOf(s, 0, clSpace)
}
