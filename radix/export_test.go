package radix

// Len is the number of live assumptions.
func (a *Approx) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.size
}
