package tokenizer

import (
	"bytes"
	"fmt"
	"slices"
	"unicode/utf8"
)

// bpeModel is the BPE model of a tokenizer.json, with its vocabulary keyed
// in the space its input arrives in: raw bytes when a ByteLevel
// pre-tokenizer ends the pre-tokenization (so the byte-to-character
// mapping never has to run), the UTF-8 text itself otherwise.
type bpeModel struct {
	vocab map[string]uint32
	// byteLevel: every byte of a word is one initial symbol; otherwise
	// every UTF-8 character is.
	byteLevel bool
	// byteID[b] is the id of the one-byte word b, -1 when the vocabulary
	// lacks it (byte-level mode only).
	byteID [256]int32
	// runeIDs maps a one-character word to its id (character mode).
	runeIDs map[rune]uint32
	// allBytes: byteID has every byte, and no prefix or suffix is set, so
	// a word's initial symbols are a table look-up per byte.
	allBytes bool

	merges       mergeTable
	ignoreMerges bool
	byteFallback bool
	fuseUnk      bool
	unkID        int64 // -1 when there is no unk token
	prefix       string
	suffix       string
	// fallbackIDs[b] is the id of "<0xXX>", -1 when absent.
	fallbackIDs [256]int32

	// wordBoundary, when not 0, is a character before which no merge can
	// join a symbol that does not end with it (SentencePiece's "▁": no
	// merge spans two words). A word can then be encoded a stretch at a
	// time, each "▁word" on its own, with the same result: the models
	// with no pre-tokenizer hand BPE whole paragraphs.
	wordBoundary rune
	// notBoundaryAfter lists the characters after which a boundary
	// character does not start a stretch, because a merge joins a symbol
	// ending with one of them to one starting with the boundary.
	notBoundaryAfter []rune
}

// mergeTable maps a pair of symbol ids to the merge's rank and the id of
// the merged symbol, in an open-addressed table: the merge look-up is the
// innermost loop of BPE and a Go map costs several times more.
type mergeTable struct {
	keys []uint64 // pair+1, 0 for an empty slot
	vals []uint64 // rank<<32 | new id
	mask uint64
}

func newMergeTable(n int) mergeTable {
	size := 16
	for size < n*2 {
		size <<= 1
	}
	return mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), mask: uint64(size - 1)}
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func mixKey(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k
}

// put sets the merge of a pair; a later merge of the same pair replaces an
// earlier one, as a map built from the merges list in order does.
func (m *mergeTable) put(a, b, rank, newID uint32) {
	k := pairKey(a, b) + 1
	for i := mixKey(k) & m.mask; ; i = (i + 1) & m.mask {
		if m.keys[i] == 0 || m.keys[i] == k {
			m.keys[i] = k
			m.vals[i] = uint64(rank)<<32 | uint64(newID)
			return
		}
	}
}

// get returns the rank and merged id of a pair; ok is false when the pair
// does not merge.
func (m *mergeTable) get(a, b uint32) (rank, newID uint32, ok bool) {
	if len(m.keys) == 0 {
		return 0, 0, false
	}
	k := pairKey(a, b) + 1
	for i := mixKey(k) & m.mask; ; i = (i + 1) & m.mask {
		switch m.keys[i] {
		case k:
			v := m.vals[i]
			return uint32(v >> 32), uint32(v), true
		case 0:
			return 0, 0, false
		}
	}
}

const noRank = ^uint32(0)

// bpeConfig is what tokenizer.json's BPE model holds, decoded.
type bpeConfig struct {
	vocab        map[string]uint32
	merges       [][2]string
	unk          *string
	prefix       string
	suffix       string
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteLevel    bool
}

func newBPE(c bpeConfig) (*bpeModel, error) {
	m := &bpeModel{
		byteLevel:    c.byteLevel,
		ignoreMerges: c.ignoreMerges,
		byteFallback: c.byteFallback,
		fuseUnk:      c.fuseUnk,
		unkID:        -1,
		prefix:       c.prefix,
		suffix:       c.suffix,
	}
	m.merges = newMergeTable(len(c.merges))
	for rank, mg := range c.merges {
		a, ok := c.vocab[mg[0]]
		if !ok {
			return nil, fmt.Errorf("cannot build BPE: merge %d names %q, which is not in the vocabulary", rank, mg[0])
		}
		b, ok := c.vocab[mg[1]]
		if !ok {
			return nil, fmt.Errorf("cannot build BPE: merge %d names %q, which is not in the vocabulary", rank, mg[1])
		}
		second := mg[1]
		if len(c.prefix) > 0 {
			if len(second) < len(c.prefix) {
				return nil, fmt.Errorf("cannot build BPE: merge %d: %q is shorter than the continuing-subword prefix", rank, second)
			}
			second = second[len(c.prefix):]
		}
		merged, ok := c.vocab[mg[0]+second]
		if !ok {
			return nil, fmt.Errorf("cannot build BPE: merge %d makes %q, which is not in the vocabulary", rank, mg[0]+second)
		}
		m.merges.put(a, b, uint32(rank), merged)
	}
	if c.unk != nil {
		id, ok := c.vocab[*c.unk]
		if !ok {
			return nil, fmt.Errorf("cannot build BPE: unk token %q is not in the vocabulary", *c.unk)
		}
		m.unkID = int64(id)
	}
	if c.byteLevel {
		// Re-key the vocabulary from byte-level characters to the bytes
		// they stand for. A key with a character outside the byte-level
		// alphabet can never be a word's text, so it is dropped.
		m.vocab = make(map[string]uint32, len(c.vocab))
		var buf []byte
		for k, id := range c.vocab {
			buf = buf[:0]
			ok := true
			for _, r := range k {
				b, isByte := byteOfChar(r)
				if !isByte {
					ok = false
					break
				}
				buf = append(buf, b)
			}
			if ok {
				m.vocab[string(buf)] = id
			}
		}
		var err error
		if m.prefix, err = byteLevelDecode(c.prefix); err != nil {
			return nil, fmt.Errorf("cannot build BPE: continuing-subword prefix: %w", err)
		}
		if m.suffix, err = byteLevelDecode(c.suffix); err != nil {
			return nil, fmt.Errorf("cannot build BPE: end-of-word suffix: %w", err)
		}
	} else {
		m.vocab = c.vocab
		m.runeIDs = make(map[rune]uint32)
		for k, id := range c.vocab {
			if r, size := utf8.DecodeRuneInString(k); size == len(k) && r != utf8.RuneError {
				m.runeIDs[r] = id
			}
		}
	}
	m.allBytes = m.byteLevel && m.prefix == "" && m.suffix == ""
	for b := range 256 {
		m.byteID[b] = -1
		if id, ok := m.vocab[string([]byte{byte(b)})]; ok && m.byteLevel {
			m.byteID[b] = int32(id)
		} else if m.byteLevel {
			m.allBytes = false
		}
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fallbackToken(byte(b))]; ok {
			m.fallbackIDs[b] = int32(id)
		}
	}
	m.wordBoundary, m.notBoundaryAfter = findWordBoundary(c, m)
	return m, nil
}

// findWordBoundary returns "▁" when the vocabulary has it, 0 otherwise,
// and the characters after which "▁" starts no stretch: the last
// characters of the left symbols of merges whose right symbol starts with
// "▁" and whose left one does not end with it.
func findWordBoundary(c bpeConfig, m *bpeModel) (rune, []rune) {
	const boundary = '▁'
	if c.byteLevel || c.ignoreMerges || c.prefix != "" || c.suffix != "" {
		return 0, nil
	}
	if _, ok := m.runeIDs[boundary]; !ok {
		return 0, nil
	}
	// A character with no token, no fallback and no unk is dropped, and
	// the symbols around it meet: the stretch would end there.
	if m.unkID < 0 {
		if !c.byteFallback {
			return 0, nil
		}
		for _, id := range m.fallbackIDs {
			if id < 0 {
				return 0, nil
			}
		}
	}
	var after []rune
	for _, mg := range c.merges {
		last, _ := utf8.DecodeLastRuneInString(mg[0])
		first, _ := utf8.DecodeRuneInString(mg[1])
		if first == boundary && last != boundary && !slices.Contains(after, last) {
			if len(after) == maxNotBoundaryAfter {
				return 0, nil
			}
			after = append(after, last)
		}
	}
	return boundary, after
}

// maxNotBoundaryAfter bounds the exceptions to a word boundary; past it,
// words are not split.
const maxNotBoundaryAfter = 32

// nextWordStart returns where the stretch of word that starts at i ends:
// before the next boundary character that follows another character (and
// none of notBoundaryAfter).
func (m *bpeModel) nextWordStart(word []byte, i int) int {
	const boundaryLen = len(string('▁'))
	// Skip the boundary characters that start the stretch.
	for i+boundaryLen <= len(word) && string(word[i:i+boundaryLen]) == "▁" {
		i += boundaryLen
	}
	for i < len(word) {
		j := bytes.Index(word[i:], []byte("▁"))
		if j < 0 {
			return len(word)
		}
		if j > 0 {
			prev, _ := utf8.DecodeLastRune(word[:i+j])
			if prev != '▁' && !slices.Contains(m.notBoundaryAfter, prev) {
				return i + j
			}
		}
		i += j + boundaryLen
	}
	return len(word)
}

// fallbackToken is the name of byte b's token, "<0xAB>".
func fallbackToken(b byte) string {
	const hex = "0123456789ABCDEF"
	return string([]byte{'<', '0', 'x', hex[b>>4], hex[b&15], '>'})
}

func byteLevelDecode(s string) (string, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteOfChar(r)
		if !ok {
			return "", fmt.Errorf("cannot map %q to bytes: it is not a byte-level character", r)
		}
		out = append(out, b)
	}
	return string(out), nil
}

// symbol is one token of a word while BPE merges it.
type symbol struct {
	id   uint32
	prev int32
	next int32
	size int32 // bytes of the word it covers; 0 once merged away
}

// linearLimit is the word length (in symbols) up to which merging rescans
// the pairs for the lowest rank instead of keeping a heap: shorter words
// are nearly all of them, and for them the scan wins.
const linearLimit = 48

// encodeWord appends the ids of one pre-tokenized word.
func (m *bpeModel) encodeWord(st *encodeState, word []byte, dst []uint32) []uint32 {
	if len(word) == 0 {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[string(word)]; ok {
			return append(dst, id)
		}
	}
	syms := m.initialSymbols(st, word)
	if len(syms) > linearLimit {
		syms = m.mergeHeap(st, syms)
	} else {
		syms = m.mergeLinear(syms)
	}
	for _, s := range syms {
		dst = append(dst, s.id)
	}
	return dst
}

// initialSymbols splits a word into its first symbols, as the model
// does before merging: one per byte (byte-level) or character, with byte
// fallback and the unknown token for what the vocabulary lacks.
func (m *bpeModel) initialSymbols(st *encodeState, word []byte) []symbol {
	syms := st.syms[:0]
	add := func(id uint32, size int) {
		syms = append(syms, symbol{id: id, size: int32(size)})
	}
	if m.allBytes {
		for _, b := range word {
			add(uint32(m.byteID[b]), 1)
		}
		st.syms = syms
		return syms
	}
	unkPending := false
	var unkSize int
	flushUnk := func() {
		if unkPending {
			add(uint32(m.unkID), unkSize)
			unkPending = false
		}
	}
	for i := 0; i < len(word); {
		size := 1
		if !m.byteLevel {
			_, size = utf8.DecodeRune(word[i:])
		}
		unit := word[i : i+size]
		first, last := i == 0, i+size == len(word)
		i += size

		id, ok := m.lookupUnit(st, unit, first, last)
		if ok {
			flushUnk()
			add(id, size)
			continue
		}
		if m.byteFallback && m.addFallback(st, unit, first, last, &syms) {
			continue
		}
		if m.unkID < 0 {
			continue // no unk token: the character is dropped, as the model does
		}
		if unkPending && m.fuseUnk {
			unkSize += size
			continue
		}
		flushUnk()
		unkPending, unkSize = true, size
	}
	flushUnk()
	st.syms = syms
	return syms
}

// lookupUnit finds the id of one initial symbol, with the continuing-subword
// prefix and end-of-word suffix where the model adds them.
func (m *bpeModel) lookupUnit(st *encodeState, unit []byte, first, last bool) (uint32, bool) {
	if (first || m.prefix == "") && (!last || m.suffix == "") {
		if m.byteLevel {
			if b := m.byteID[unit[0]]; b >= 0 {
				return uint32(b), true
			}
			return 0, false
		}
		r, size := utf8.DecodeRune(unit)
		if size == len(unit) && r != utf8.RuneError {
			id, ok := m.runeIDs[r]
			return id, ok
		}
		id, ok := m.vocab[string(unit)]
		return id, ok
	}
	st.unit = m.affixed(st.unit[:0], unit, first, last)
	id, ok := m.vocab[string(st.unit)]
	return id, ok
}

func (m *bpeModel) affixed(dst, unit []byte, first, last bool) []byte {
	if !first {
		dst = append(dst, m.prefix...)
	}
	dst = append(dst, unit...)
	if last {
		dst = append(dst, m.suffix...)
	}
	return dst
}

// addFallback appends the byte tokens of a symbol's text as the model
// spells it (byte-level characters stay UTF-8 there); false, and nothing
// added, when one of them is missing.
func (m *bpeModel) addFallback(st *encodeState, unit []byte, first, last bool, syms *[]symbol) bool {
	st.unit = m.affixed(st.unit[:0], unit, first, last)
	text := st.unit
	if m.byteLevel {
		// The model sees the byte-level characters, so fall back on
		// their UTF-8 bytes.
		st.unit2 = st.unit2[:0]
		for _, b := range text {
			st.unit2 = utf8.AppendRune(st.unit2, charOfByte[b])
		}
		text = st.unit2
	}
	for _, b := range text {
		if m.fallbackIDs[b] < 0 {
			return false
		}
	}
	for _, b := range text {
		*syms = append(*syms, symbol{id: uint32(m.fallbackIDs[b]), size: 1})
	}
	return true
}

// mergeLinear merges the lowest-ranked adjacent pair, leftmost first,
// until no pair merges: the order the model's priority queue yields.
func (m *bpeModel) mergeLinear(syms []symbol) []symbol {
	n := len(syms)
	if n < 2 {
		return syms
	}
	// ranks[i] is the rank of the pair (i, i+1); syms[i].prev holds the
	// merged id for it while merging.
	var ranksBuf [linearLimit]uint32
	var idsBuf [linearLimit]uint32
	ranks := ranksBuf[:n-1]
	newIDs := idsBuf[:n-1]
	for i := 0; i+1 < n; i++ {
		r, id, ok := m.merges.get(syms[i].id, syms[i+1].id)
		if !ok {
			r = noRank
		}
		ranks[i], newIDs[i] = r, id
	}
	for n > 1 {
		best, bi := noRank, -1
		for i, r := range ranks[:n-1] {
			if r < best {
				best, bi = r, i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi].id = newIDs[bi]
		syms[bi].size += syms[bi+1].size
		copy(syms[bi+1:n], syms[bi+2:n])
		copy(ranks[bi:n-1], ranks[bi+1:n-1])
		copy(newIDs[bi:n-1], newIDs[bi+1:n-1])
		n--
		if bi > 0 {
			r, id, ok := m.merges.get(syms[bi-1].id, syms[bi].id)
			if !ok {
				r = noRank
			}
			ranks[bi-1], newIDs[bi-1] = r, id
		}
		if bi+1 < n {
			r, id, ok := m.merges.get(syms[bi].id, syms[bi+1].id)
			if !ok {
				r = noRank
			}
			ranks[bi], newIDs[bi] = r, id
		}
	}
	return syms[:n]
}

// mergeCandidate is a pair waiting in mergeHeap's queue.
type mergeCandidate struct {
	rank  uint32
	pos   int32
	newID uint32
}

func (c mergeCandidate) before(o mergeCandidate) bool {
	return c.rank < o.rank || (c.rank == o.rank && c.pos < o.pos)
}

// mergeQueue is a binary min-heap, written out because container/heap
// boxes every element it moves through an interface.
type mergeQueue []mergeCandidate

func (q mergeQueue) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q[i].before(q[parent]) {
			return
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (q mergeQueue) down(i int) {
	n := len(q)
	for {
		least := i
		if l := 2*i + 1; l < n && q[l].before(q[least]) {
			least = l
		}
		if r := 2*i + 2; r < n && q[r].before(q[least]) {
			least = r
		}
		if least == i {
			return
		}
		q[i], q[least] = q[least], q[i]
		i = least
	}
}

func (q *mergeQueue) push(c mergeCandidate) {
	*q = append(*q, c)
	q.up(len(*q) - 1)
}

func (q *mergeQueue) pop() mergeCandidate {
	old := *q
	top := old[0]
	last := len(old) - 1
	old[0] = old[last]
	*q = old[:last]
	q.down(0)
	return top
}

// mergeHeap merges as mergeLinear does, in O(n log n) for long words,
// with a priority queue of candidate pairs ordered by rank then position;
// a candidate whose pair has since changed is skipped when popped.
func (m *bpeModel) mergeHeap(st *encodeState, syms []symbol) []symbol {
	for i := range syms {
		syms[i].prev = int32(i - 1)
		syms[i].next = int32(i + 1)
	}
	syms[len(syms)-1].next = -1
	q := st.queue[:0]
	for i := 0; i+1 < len(syms); i++ {
		if r, id, ok := m.merges.get(syms[i].id, syms[i+1].id); ok {
			q = append(q, mergeCandidate{rank: r, pos: int32(i), newID: id})
		}
	}
	for i := len(q)/2 - 1; i >= 0; i-- {
		q.down(i)
	}
	for len(q) > 0 {
		top := q.pop()
		s := &syms[top.pos]
		if s.size == 0 || s.next < 0 {
			continue
		}
		right := syms[s.next]
		if _, id, ok := m.merges.get(s.id, right.id); !ok || id != top.newID {
			continue
		}
		s.id = top.newID
		s.size += right.size
		syms[s.next].size = 0
		s.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if s.prev >= 0 {
			if r, id, ok := m.merges.get(syms[s.prev].id, s.id); ok {
				q.push(mergeCandidate{rank: r, pos: s.prev, newID: id})
			}
		}
		if s.next >= 0 {
			if r, id, ok := m.merges.get(s.id, syms[s.next].id); ok {
				q.push(mergeCandidate{rank: r, pos: top.pos, newID: id})
			}
		}
	}
	st.queue = q
	out := syms[:0]
	for _, s := range syms {
		if s.size != 0 {
			out = append(out, s)
		}
	}
	return out
}

// charOfByte is the byte-level alphabet: the printable character GPT-2's
// byte-level BPE writes for each byte.
var charOfByte = func() (t [256]rune) {
	n := rune(0)
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = 256 + n
			n++
		}
	}
	return t
}()

func byteOfChar(r rune) (byte, bool) {
	switch {
	case r < 256 && charOfByte[r] == r:
		return byte(r), true
	case r >= 256 && r < 256+68:
		for b, c := range charOfByte {
			if c == r {
				return byte(b), true
			}
		}
	}
	return 0, false
}
