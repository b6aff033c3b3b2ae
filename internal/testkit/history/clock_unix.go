//go:build unix

package history

import (
	"time"

	"golang.org/x/sys/unix"
)

// Now returns the host's monotonic clock (CLOCK_MONOTONIC) as a time.Time
// counted from the Unix epoch. Every process on the host reads the same
// clock, and no wall-clock step (NTP, an operator, a VM resumed) moves it,
// so holds and writes that several processes record in a history are
// ordered by when they happened. Times from Now are comparable only with
// each other, never with time.Now.
func Now() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("history: CLOCK_MONOTONIC: " + err.Error())
	}
	return time.Unix(0, ts.Nano())
}
