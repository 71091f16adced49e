package chat

import "time"

// SetNow pins strftime_now's clock, so that a rendering can be compared
// with the reference's.
func SetNow(t *Template, now time.Time) { t.now = func() time.Time { return now } }
