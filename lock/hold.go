package lock

import (
	"context"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// holdID identifies one owner's hold of one lock.
type holdID struct {
	key   string
	owner int64
}

// A hold is one owner's possession of one lock, from its first acquisition to
// its final release or its loss. Its context is the one Lock returns.
type hold struct {
	c     *Client
	id    holdID
	name  string // as the caller wrote it, for errors
	field string

	// sem serialises the acquisitions and releases of this hold, so that the
	// hold count sent to Redis is always the one this process last saw.
	sem chan struct{}

	// Guarded by sem.
	levels int
	token  fencing.Token
	lease  time.Duration // lease of every acquisition and renewal
	fixed  bool          // WithLease: no watchdog
	unsure bool          // a release failed with an unknown outcome

	// Set once at the first acquisition, before the hold is published.
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // releases the lease deadline timer; nil without WithLease

	// Guarded by c.mu.
	refs   int  // operations in progress on this hold
	pinned bool // held: stays registered until released or lost
	lost   bool

	renewal renewal // how the watchdog renews the hold
}

// holdCtxKey marks the contexts that descend from a hold's context.
type holdCtxKey struct{ h *hold }

// ref returns the hold of owner on key, creating it when there is none, and
// counts the caller as using it until unref.
func (c *Client) ref(key, name string, owner int64) *hold {
	id := holdID{key, owner}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[id]
	if h == nil {
		h = &hold{c: c, id: id, name: name, field: c.field(owner), sem: make(chan struct{}, 1)}
		h.renewal = renewal{
			script: renewScript,
			keys:   []string{key},
			args:   []any{h.field},
			lost: func(why string) {
				if c.lose(h) {
					h.end(lostError(h.name, why))
				}
			},
		}
		c.holds[id] = h
	}
	h.refs++
	return h
}

// refHeld is ref for a hold that is held; it returns nil when there is none.
func (c *Client) refHeld(key string, owner int64) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[holdID{key, owner}]
	if h == nil || !h.pinned {
		return nil
	}
	h.refs++
	return h
}

// unref ends one use of h; an unused hold that is not held is forgotten.
func (c *Client) unref(h *hold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.refs--
	if h.refs == 0 && !h.pinned && c.holds[h.id] == h {
		delete(c.holds, h.id)
	}
}

// pin records that h is held.
func (c *Client) pin(h *hold) {
	c.mu.Lock()
	h.pinned = true
	c.mu.Unlock()
}

// unpin records that h was released.
func (c *Client) unpin(h *hold) {
	c.mu.Lock()
	h.pinned = false
	c.mu.Unlock()
}

// lose records that h was lost and forgets it, so that the owner's next Lock
// starts afresh. It reports whether h was held until now; the caller then
// cancels h's context.
func (c *Client) lose(h *hold) bool {
	c.dog.remove(&h.renewal)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !h.pinned {
		return false
	}
	h.pinned, h.lost = false, true
	if c.holds[h.id] == h {
		delete(c.holds, h.id)
	}
	return true
}

// isLost reports whether h was lost.
func (c *Client) isLost(h *hold) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return h.lost
}

// enter waits for h's semaphore or for ctx to end.
func (h *hold) enter(ctx context.Context) error {
	select {
	case h.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave releases h's semaphore.
func (h *hold) leave() { <-h.sem }

// begin creates h's context at its first acquisition. It descends from ctx,
// carries the owner (if ctx did not already) and the token, and with a fixed
// lease ends by itself when the lease runs out, measured from start (the
// moment the acquisition was sent, so the context never outlives the lock).
func (h *hold) begin(ctx context.Context, ownerNew bool, start time.Time) {
	if ownerNew {
		ctx = context.WithValue(ctx, ownerKey{h.c}, h.id.owner)
	}
	hctx, cancel := context.WithCancelCause(ctx)
	h.cancel = cancel
	if h.fixed {
		hctx, h.stop = context.WithDeadlineCause(hctx, start.Add(h.lease),
			lostError(h.name, "its lease of "+h.lease.String()+" ran out"))
	}
	hctx = context.WithValue(hctx, holdCtxKey{h}, true)
	h.ctx = fencing.WithToken(hctx, h.token)
}

// end cancels h's context with cause.
func (h *hold) end(cause error) {
	h.cancel(cause)
	if h.stop != nil {
		h.stop()
	}
}

// levelContext returns the context of a re-entry of h made with ctx. When ctx
// descends from h's context it already ends with the hold; otherwise the
// returned context is tied to the hold so that it is cancelled too when the
// hold is lost or released.
func (h *hold) levelContext(ctx context.Context) context.Context {
	if ctx.Value(holdCtxKey{h}) == nil {
		child, cancel := context.WithCancelCause(ctx)
		hctx := h.ctx
		context.AfterFunc(hctx, func() { cancel(context.Cause(hctx)) })
		ctx = context.WithValue(child, holdCtxKey{h}, true)
	}
	if tok, _ := fencing.FromContext(ctx); tok != h.token {
		ctx = fencing.WithToken(ctx, h.token)
	}
	return ctx
}
