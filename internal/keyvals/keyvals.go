package keyvals

import (
	"fmt"
	"strings"
)

// Pair is one key=value of a list, the key as it was spelled.
type Pair struct{ Key, Value string }

// Split reads list ("k=v,k=v", spaces around items ignored). aliases maps
// each other name of a key to its canonical one; a key given twice,
// under one name or two, is refused, as is an item without "=".
func Split(list string, aliases map[string]string) ([]Pair, error) {
	var pairs []Pair
	given := map[string]string{} // canonical key → the spelling it was first given under
	n := 0
	for item := range strings.SplitSeq(list, ",") {
		n++
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			// Its place, not its text: an item without "=" may be the
			// rest of a value cut at a comma, such as a password's.
			return nil, fmt.Errorf("want key=value pairs separated by commas: item %d has no '='", n)
		}
		key := k
		if canonical, ok := aliases[k]; ok {
			key = canonical
		}
		if first, ok := given[key]; ok {
			if first != k {
				return nil, fmt.Errorf("%s= repeats %s=, another name for it", k, first)
			}
			return nil, fmt.Errorf("%s= is given twice", k)
		}
		given[key] = k
		pairs = append(pairs, Pair{k, v})
	}
	return pairs, nil
}
