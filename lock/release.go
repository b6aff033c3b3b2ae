package lock

import (
	"context"
	"errors"
	"time"
)

// The single-key release path: engine.unlock releases one level of the
// hold the context carries (releaseLevel), hands the last one over when a
// waiter of the Client can take it (handover.go), records the outcome
// (settle) and retries a failed final release in the background
// (releaseLater) until the hold's lease ends: those two in settle.go.

// parentEnded releases h, every level of it, because the context it was
// taken with ended: as its final Unlock would, handing it to a waiter of
// this Client or freeing it and waking the others. h's context has ended
// with the parent's cause already; an Unlock that comes later returns nil.
func (h *hold) parentEnded() {
	c := h.c
	h.use()
	defer h.unuse()
	_ = h.enter(context.Background())
	defer h.leave()
	if h.levels == 0 || !h.held() {
		return
	}
	h.ended = true
	h.levels = 1 // the last level's release removes the owner whatever its count
	ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
	defer cancel()
	if err := c.releaseLevel(ctx, h); err != nil && !errors.Is(err, ErrLost) {
		c.opts.logger.DebugContext(h.parent, "lock: releasing a hold whose context ended failed; retried until its lease ends",
			"lock", h.name, "err", err)
	}
}

// unlock releases one level of the hold ctx carries under hk: the one way
// every single-key lock type unlocks.
func (c *engine) unlock(ctx context.Context, hk any, name string) error {
	if ctx == nil {
		return noContext(name)
	}
	h := heldBy(ctx, hk)
	if h == nil {
		if errors.Is(context.Cause(ctx), ErrLost) {
			return wrap(name, ErrLost)
		}
		return wrap(name, ErrNotHeld)
	}
	h.use()
	defer h.unuse()
	_ = h.enter(context.Background())
	defer h.leave()
	if !h.held() {
		switch cause := context.Cause(h.ctx); {
		case h.ended:
			return nil // released when the context it was taken with ended
		case h.isLost():
			return h.lostErr()
		case errors.Is(cause, errReleasedLater), h.releasedLater:
			return nil // the retry of an Unlock that failed, completed meanwhile
		}
		return wrap(name, ErrNotHeld)
	}
	return c.releaseLevel(ctx, h)
}

// releaseLevel releases one level of h, whose semaphore the caller holds.
func (c *engine) releaseLevel(ctx context.Context, h *hold) error {
	if h.isLost() {
		return h.lostErr()
	}
	if h.levels == 0 {
		return wrap(h.name, ErrNotHeld)
	}
	renewed := c.releasing(h)
	turn := false
	others := int64(0)
	channel := h.kind.channel(h)
	if h.levels == 1 {
		w, end := c.reserveHandover(h)
		if w == nil && end {
			if others = c.othersListening(ctx, channel); others == 0 {
				// Nobody else waits for a turn: hand over on.
				c.renewTurn(channel)
				w, end = c.reserveHandover(h)
			}
		}
		if w != nil {
			var until time.Time // when h's lease ends unless renewed, if the watchdog renewed it
			if renewed {
				until = c.dog.leaseEnd(&h.renewal)
			}
			return c.handOver(ctx, h, w, until, renewed)
		}
		turn = end
	}
	if turn {
		c.startTurn(channel, others)
	}
	left, err := h.kind.release(h.detach(ctx), h)
	if turn {
		c.endTurn(channel)
	} else if h.levels == 1 && err == nil {
		c.freed(channel)
	}
	return c.settle(h, renewed, left, err)
}

// tieToParent makes h end with the context it was taken with: when that
// context ends, h is released as if its final Unlock had come (see
// parentEnded). It costs no goroutine while h is held, and nothing for a
// context that never ends.
func (h *hold) tieToParent() {
	if h.parent.Done() == nil {
		return
	}
	stop := context.AfterFunc(h.parent, h.parentEnded)
	t := &h.c.holds
	t.mu.Lock()
	if h.pinned {
		h.stopLife, stop = stop, nil
	}
	t.mu.Unlock()
	if stop != nil { // lost or released meanwhile
		stop()
	}
}
