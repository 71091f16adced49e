package radix

import "encoding/binary"

// The index region, the shared-memory segment and the hash scheme all fix
// little-endian byte order, and the hot paths rely on the host order
// matching it (zero-copy token views, atomics on region words). A
// big-endian build fails at start-up rather than computing silently
// different hashes.
func init() {
	var probe [2]byte
	binary.NativeEndian.PutUint16(probe[:], 1)
	if probe[0] != 1 {
		panic("kvfast: big-endian hosts are not supported; the shm layout and block hashes are little-endian")
	}
}
