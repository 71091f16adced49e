//go:build invariants || race

package invariants

// Enabled is true: this build checks internal invariants.
const Enabled = true
