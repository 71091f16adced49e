package replay

import (
	"fmt"
	"math"
	"sort"
	"strconv"
)

// WorkloadMultimodal sends each record as the chat workload's
// conversation with images in some of its user turns (ChatSynth.Images),
// so that the router's encoder stage has items to route.
const WorkloadMultimodal = "multimodal"

// Defaults of the multimodal workload's images. A few hundred images of
// which a few are very popular is the shape of shared media (product
// photos, memes, screenshots of one document) in a chat service: web and
// media object popularity follows Zipf's law with an exponent near 1
// (Breslau et al., "Web caching and Zipf-like distributions", 1999,
// measured 0.64 to 0.83 for web pages; video and image services report
// 0.8 to 1). At exponent 1 over 512 images the most popular image is
// about one draw in seven, the top 32 are 60% of the draws, the top 64
// 70%, and a fifth of the draws fall outside the top 128: more images
// than one engine's encoder cache holds (the demo's holds 32), so where
// an image is encoded decides whether it is encoded again. One user turn
// in twenty carries an image: the shipped trace's records have about 40
// hash ids, so a request carries about two images (the demo's 600 send
// 1141, 151 distinct), and its longest conversations (374 hash ids) stay
// well under the router's 64-item limit.
const (
	DefaultImages        = 512
	DefaultImageExponent = 1.0
	DefaultImageTurnRate = 0.05
)

// ImageSynth says which user turns of a synthesised conversation carry an
// image, and which: a turn carries one with probability TurnRate, drawn
// from a set of Images images of Zipf popularity (the image of rank k,
// counted from 1, is drawn in proportion to 1/k^Exponent). Both draws are
// keyed by (Seed, the turn's hash id) alone, as the turn's text is, so
// two records sharing a prefix of hash ids share its images too, and the
// shared prefix stays a shared prefix of tokens. The zero value means the
// defaults.
type ImageSynth struct {
	Images   int
	Exponent float64
	TurnRate float64
	Seed     uint64
}

func (m ImageSynth) normalized() ImageSynth {
	if m.Images == 0 {
		m.Images = DefaultImages
	}
	if m.Exponent == 0 {
		m.Exponent = DefaultImageExponent
	}
	if m.TurnRate == 0 {
		m.TurnRate = DefaultImageTurnRate
	}
	return m
}

// maxImages bounds the set, whose popularity table is kept in memory.
const maxImages = 1 << 20

// ImageSet is a compiled ImageSynth: its popularity table. It is
// immutable and safe to share between goroutines.
type ImageSet struct {
	synth ImageSynth
	cdf   []float64 // cdf[k]: probability of drawing rank k or a more popular one
}

// NewImageSet compiles m.
func NewImageSet(m ImageSynth) (*ImageSet, error) {
	m = m.normalized()
	switch {
	case m.Images < 1 || m.Images > maxImages:
		return nil, fmt.Errorf("cannot draw from %d images: want 1..%d", m.Images, maxImages)
	case !(m.Exponent > 0) || math.IsInf(m.Exponent, 1):
		return nil, fmt.Errorf("cannot use Zipf exponent %v: want a positive number", m.Exponent)
	case !(m.TurnRate > 0 && m.TurnRate <= 1):
		return nil, fmt.Errorf("cannot put images in a fraction %v of turns: want (0, 1]", m.TurnRate)
	}
	set := &ImageSet{synth: m, cdf: make([]float64, m.Images)}
	sum := 0.0
	for k := range set.cdf {
		sum += math.Pow(float64(k+1), -m.Exponent)
		set.cdf[k] = sum
	}
	for k := range set.cdf {
		set.cdf[k] /= sum
	}
	return set, nil
}

// Synth returns what the set was compiled from, defaults filled in.
func (s *ImageSet) Synth() ImageSynth { return s.synth }

// Image returns the image of the user turn of hashID: its popularity
// rank, 0 the most popular, or false when the turn has none.
func (s *ImageSet) Image(hashID uint64) (rank int, ok bool) {
	z := mix64(s.synth.Seed ^ mix64(hashID+0x510e527fade682d1))
	if unit(z) >= s.synth.TurnRate {
		return 0, false
	}
	u := unit(mix64(z ^ 0x9b05688c2b3e6c1f))
	k := sort.SearchFloat64s(s.cdf, u)
	// u < 1 = cdf[last] up to rounding, which could leave k past the end.
	return min(k, len(s.cdf)-1), true
}

// unit maps z to [0, 1).
func unit(z uint64) float64 { return float64(z>>11) / (1 << 53) }

// AppendImages appends the ranks of the images chat sends for r, in the
// order of its user turns (an image may come twice).
func (s *ImageSet) AppendImages(dst []int, chat ChatSynth, r *Record) []int {
	chat = chat.normalized()
	for _, id := range r.HashIDs[chat.systemIDs(r):] {
		if k, ok := s.Image(id); ok {
			dst = append(dst, k)
		}
	}
	return dst
}

// imageURLPrefix names the images. The router hashes an http(s) URL for
// the image's identity without fetching it, and so does the mock engine
// for its mm_hash; example.com is reserved, so nothing is ever fetched
// from it by mistake.
const imageURLPrefix = `https://images.example.com/kvfast/`

// appendUserContent appends the content of the user turn of hashID, its
// first n words: a JSON string, or with an image an array of the
// image_url part and the text part.
func (s ChatSynth) appendUserContent(dst []byte, hashID uint64, n int) []byte {
	k, ok := 0, false
	if s.Images != nil {
		k, ok = s.Images.Image(hashID)
	}
	if !ok {
		dst = append(dst, '"')
		dst = s.AppendText(dst, hashID, n)
		return append(dst, '"')
	}
	dst = append(dst, `[{"type":"image_url","image_url":{"url":"`+imageURLPrefix...)
	dst = strconv.AppendInt(dst, int64(k), 10)
	dst = append(dst, `.png"}},{"type":"text","text":"`...)
	dst = s.AppendText(dst, hashID, n)
	return append(dst, `"}]`...)
}
