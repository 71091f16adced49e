// Package keyvals reads the comma-separated key=value lists of kvfast's
// endpoint flags (kvfast serve --worker, kvfast epp --endpoint): each key
// at most once, under any of its names. A key given twice is a typo or a
// paste, and which value was meant cannot be told, so it is refused
// rather than the last one silently winning.
package keyvals
