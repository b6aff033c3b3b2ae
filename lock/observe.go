package lock

import (
	"context"
	"errors"
	"time"
)

// What a Client tells its Observer (see observer.go), and when.

// observe reports t about h, an established hold, to the Client's
// Observer, if any.
func (c *link) observe(h *hold, t EventType, wait time.Duration, cause error) {
	c.observeIn(h.parent, h, t, wait, cause)
}

// observeIn reports t about h, taken with ctx, to the Client's Observer, if
// any.
func (c *link) observeIn(ctx context.Context, h *hold, t EventType, wait time.Duration, cause error) {
	if c == nil || c.opts.observer == nil {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	kind, mode := kindOf(h.kind)
	e := Event{Type: t, Kind: kind, Mode: mode, Name: h.name, Token: h.token, Wait: wait, Cause: cause, Owner: h.field, Context: ctx}
	if t != EventAcquired && !h.start.IsZero() {
		e.Held = time.Since(h.start)
	}
	c.opts.observer(e)
}

// ended reports the end of h with cause, once.
func (c *link) ended(h *hold, cause error) {
	if c.opts.observer == nil || !h.reported.CompareAndSwap(false, true) {
		return
	}
	switch {
	case errors.Is(cause, ErrLost):
		c.observe(h, EventLost, 0, cause)
	case errors.Is(cause, errReleasedLater):
		c.observe(h, EventReleasedLater, 0, nil)
	default:
		c.observe(h, EventReleased, 0, nil)
	}
}

// kindOf returns the Kind and the mode of a hold of kind k: what its
// observedAs says, and for the kinds without one (Mutex, FairMutex: the
// RLock hash) KindMutex.
func kindOf(k kind) (Kind, string) {
	if o, ok := k.(observedKind); ok {
		return o.observedAs()
	}
	return KindMutex, ""
}

// An observedKind is a kind the Observer names other than KindMutex.
type observedKind interface {
	observedAs() (Kind, string)
}
