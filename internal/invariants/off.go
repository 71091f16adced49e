//go:build !invariants && !race

package invariants

// Enabled is false: this build skips internal invariant checks.
const Enabled = false
