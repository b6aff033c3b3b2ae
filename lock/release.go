package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The single-key release path: Client.unlock releases one level of the
// hold the context carries (releaseLevel), hands the last one over when a
// waiter of the Client can take it (handover.go), records the outcome
// (settle) and retries a failed final release in the background
// (releaseLater) until the hold's lease ends.

// parentEnded releases h, every level of it, because the context it was
// taken with ended: as its final Unlock would, handing it to a waiter of
// this Client or freeing it and waking the others. h's context has ended
// with the parent's cause already; an Unlock that comes later returns nil.
func (h *hold) parentEnded() {
	c := h.c
	c.holds.refAgain(h)
	defer c.holds.unref(h)
	_ = h.enter(context.Background())
	defer h.leave()
	if h.levels == 0 || !c.holds.stillHeld(h) {
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
func (c *Client) unlock(ctx context.Context, hk any, name string) error {
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
	c.holds.refAgain(h)
	defer c.holds.unref(h)
	_ = h.enter(context.Background())
	defer h.leave()
	if !c.holds.stillHeld(h) {
		switch cause := context.Cause(h.ctx); {
		case h.ended:
			return nil // released when the context it was taken with ended
		case c.holds.isLost(h):
			return lostHold(h)
		case errors.Is(cause, errReleasedLater), h.releasedLater:
			return nil // the retry of an Unlock that failed, completed meanwhile
		}
		return wrap(name, ErrNotHeld)
	}
	return c.releaseLevel(ctx, h)
}

// releaseLevel releases one level of h, whose semaphore the caller holds.
func (c *Client) releaseLevel(ctx context.Context, h *hold) error {
	if c.holds.isLost(h) {
		return lostHold(h)
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
	left, err := h.kind.release(context.WithoutCancel(ctx), h)
	if turn {
		c.endTurn(channel)
	} else if h.levels == 1 && err == nil {
		c.freed(channel)
	}
	return c.settle(h, renewed, left, err)
}

// releasing prepares the release of one level of h: before the final one,
// the watchdog stops renewing it (no renewal may follow the final release).
// It reports whether h was being renewed.
func (c *Client) releasing(h *hold) bool {
	if h.levels == 1 {
		return c.dog.remove(&h.renewal)
	}
	return false
}

// settle records the outcome of releasing one level of h: the levels Redis
// has left, or the error of the call. renewed is what releasing returned.
func (c *Client) settle(h *hold, renewed bool, left int64, err error) error {
	final := h.levels == 1
	if err != nil {
		h.unsure = h.unsure || outcomeUnknown(err)
		if final && !h.retrying {
			// The owner asked to release: renewing the lock now would keep
			// it held for as long as the Client lives if nobody retried.
			// Retry in the background until it is released or its lease
			// ends; a retry by the caller is welcome meanwhile.
			h.retrying = true
			h.retry++
			until, gen := h.leaseEnd(renewed), h.retry
			c.goBackground(func() { c.releaseLater(h, until, gen) })
		}
		return wrap(h.name, noted("unlock", unavailable(err)))
	}
	switch {
	case left > 0 && !final:
		h.levels--
		h.unsure = false
		return nil
	case left == 0 && final, left < 0 && final && h.unsure:
		// Released now, or by an earlier call whose reply was lost.
		c.released(h)
		if cause := context.Cause(h.ctx); errors.Is(cause, ErrLost) {
			// A fixed lease ran out before the release arrived: the key
			// outlived it by a moment, but the protection had ended.
			return cause
		}
		return nil
	}
	if c.holds.lose(h) {
		h.end(lostError(h.name, "it was not held any more when it was unlocked"))
	}
	return lostHold(h)
}

// leaseEnd returns when h's lease ends unless renewed: the watchdog's
// lease when it renewed h until now (renewed), a fixed hold's deadline,
// which a re-entry may have extended (see extendTo).
func (h *hold) leaseEnd(renewed bool) time.Time {
	if renewed {
		return h.c.dog.leaseEnd(&h.renewal)
	}
	t := &h.c.holds
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.expiry != nil {
		return h.expiry.at
	}
	return time.Now().Add(h.lease)
}

// releaseLater retries the final release of h, which failed, until it
// succeeds, the caller's own retry succeeds, or h's lease ends at until
// (then the lock has expired in Redis: h is declared lost). gen is the
// retry it is (h.retry when it started): once h was re-entered since, it
// stops, and leaves h to the retry of a later failed release, if any, which
// goes on until the lease h has then ends.
func (c *Client) releaseLater(h *hold, until time.Time, gen uint8) {
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		select {
		case <-time.After(min(backoff, max(time.Until(until), 0))):
		case <-c.done:
			return
		}
		ctx, cancel := c.backgroundContext(max(time.Until(until), 10*time.Millisecond))
		err := h.enter(ctx)
		if err != nil {
			cancel()
			continue
		}
		if h.retry != gen {
			// Re-entered since (see reentered): not this retry's any more.
			h.leave()
			cancel()
			return
		}
		done := !h.retrying || h.levels != 1 || !c.holds.stillHeld(h)
		if !done && !time.Now().Before(until) {
			if c.holds.lose(h) {
				h.end(lostError(h.name, "its release failed and its lease ran out"))
			}
			done = true
		}
		if !done {
			left, err := h.kind.release(ctx, h)
			switch {
			case err != nil:
				h.unsure = h.unsure || outcomeUnknown(err)
			case left == 0 || left < 0 && h.unsure:
				c.releasedWith(h, errReleasedLater)
				done = true
			default:
				if c.holds.lose(h) {
					h.end(lostError(h.name, "it was not held any more when it was unlocked"))
				}
				done = true
			}
		}
		if done {
			h.retrying = false
		}
		h.leave()
		cancel()
		if done {
			return
		}
	}
}

// released records the final release of h.
func (c *Client) released(h *hold) { c.releasedWith(h, ErrReleased) }

// errReleasedLater is the cause of a context whose final release failed and
// was then completed by releaseLater: the caller's own retry of Unlock,
// arriving after that, succeeds too.
var errReleasedLater = fmt.Errorf("%w after a failed unlock was retried", ErrReleased)

func (c *Client) releasedWith(h *hold, cause error) {
	h.levels = 0
	h.unsure = false
	h.releasedLater = cause == errReleasedLater
	c.dog.remove(&h.renewal)
	c.holds.unpin(h)
	switch h.released.err {
	case nil:
		h.released = nameError{name: h.name, err: cause}
		h.end(&h.released)
	case cause: // its context ended as its lock was handed over (handingOver)
		h.end(&h.released)
	default:
		h.end(wrap(h.name, cause))
	}
}

// handingOver ends h's context, with cause ErrReleased, as its final
// release hands its lock to the next holder: before that holder is woken,
// so that two contexts of one lock are never live at once. The release is
// decided then, whatever the transfer's outcome; its end is told to the
// Observer when the outcome is known (released, or lost when the transfer
// finds the lock gone), and a release that fails is retried in the
// background as any other (see settle).
func (h *hold) handingOver() {
	if h.released.err == nil {
		// Once set, the cause may be read at any moment (context.Cause): a
		// retry of the release that hands over again leaves it as it is.
		h.released = nameError{name: h.name, err: ErrReleased}
	}
	h.cancel(&h.released)
}

// lostHold is the error for an operation on a hold that was lost.
func lostHold(h *hold) error {
	if cause := context.Cause(h.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return wrap(h.name, ErrLost)
}
