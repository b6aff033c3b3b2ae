// Package ctxutil holds the context helpers that lock and gormplugin share.
package ctxutil

import (
	"context"
	"time"
)

// Ended reports whether ctx is over. A context whose deadline has passed
// counts even when its timer has not fired yet: on a loaded machine that
// timer can run after a timer of the caller's or a network deadline taken
// from the context. Ended then waits the moment it takes, so that ctx.Err
// and context.Cause say why. A context whose Done is nil can never end,
// whatever deadline it reports.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	done := ctx.Done()
	if done == nil {
		return false
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-done
		return true
	}
	return false
}
