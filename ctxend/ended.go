// Package ctxend tells whether a context is over, deadline timers that run
// late included. It is the one context helper that lock and gormplugin
// share; it is public only because they are separate packages.
package ctxend

import (
	"context"
	"time"
)

// timerLag bounds how long Ended waits for a context whose deadline has
// passed to say so. A context's deadline timer runs late on a loaded
// machine by a scheduling delay, far less than this; a context whose Done
// does not close by then has no such timer (a derived context whose parent
// reports a deadline it never enforces) or a deadline read from a wall
// clock that jumped, and is taken as not ended.
const timerLag = 100 * time.Millisecond

// Ended reports whether ctx is over. A context whose deadline has passed
// counts even when its timer has not fired yet: on a loaded machine that
// timer can run after a timer of the caller's or a network deadline taken
// from the context. Ended then waits the moment it takes (at most
// timerLag), so that ctx.Err and context.Cause say why. A context whose
// Done is nil can never end, whatever deadline it reports.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	done := ctx.Done()
	if done == nil {
		return false
	}
	d, ok := ctx.Deadline()
	if !ok || time.Now().Before(d) {
		return false
	}
	t := time.NewTimer(timerLag)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
