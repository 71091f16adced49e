package radix

import "time"

func time0() time.Time { return time.Unix(1_800_000_000, 0) }
