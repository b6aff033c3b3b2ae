//go:build !unix

package history

import "time"

var origin = time.Now()

// Now returns the time elapsed on this process's monotonic clock, counted
// from the Unix epoch, so that no wall-clock step moves it. Without a
// host-wide monotonic clock, times from different processes do not compare.
func Now() time.Time { return time.Unix(0, int64(time.Since(origin))) }
