package shm

// setFallocate replaces the reservation call, for tests that need a full
// file system; it returns what puts the real one back.
func setFallocate(f func(fd int, mode uint32, off, size int64) error) (restore func()) {
	old := fallocate
	fallocate = f
	return func() { fallocate = old }
}
