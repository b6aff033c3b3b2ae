package lock

// The end of a release: its outcome recorded (settle), a failed final
// release retried in the background (releaseLater), and the hold let go of
// (released). The release paths (release.go) and the handover (handover.go)
// end here.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// releasing prepares the release of one level of h: before the final one,
// the watchdog stops renewing it (no renewal may follow the final release).
// It reports whether h was being renewed.
func (c *engine) releasing(h *hold) bool {
	if h.levels == 1 {
		return c.dog.remove(&h.renewal)
	}
	return false
}

// settle records the outcome of releasing one level of h: the levels Redis
// has left, or the error of the call. renewed is what releasing returned.
func (c *engine) settle(h *hold, renewed bool, left int64, err error) error {
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
	h.lostBecause("it was not held any more when it was unlocked")
	return h.lostErr()
}

// releaseLater retries the final release of h, which failed, until it
// succeeds, the caller's own retry succeeds, or h's lease ends at until
// (then the lock has expired in Redis: h is declared lost). gen is the
// retry it is (h.retry when it started): once h was re-entered since, it
// stops, and leaves h to the retry of a later failed release, if any, which
// goes on until the lease h has then ends.
func (c *engine) releaseLater(h *hold, until time.Time, gen uint8) {
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
		done := !h.retrying || h.levels != 1 || !h.held()
		if !done && !time.Now().Before(until) {
			h.lostBecause("its release failed and its lease ran out")
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
				h.lostBecause("it was not held any more when it was unlocked")
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
func (c *engine) released(h *hold) { c.releasedWith(h, ErrReleased) }

func (c *engine) releasedWith(h *hold, cause error) {
	h.levels = 0
	h.unsure = false
	h.releasedLater = cause == errReleasedLater
	c.dog.remove(&h.renewal)
	h.unpin()
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

// errReleasedLater is the cause of a context whose final release failed and
// was then completed by releaseLater: the caller's own retry of Unlock,
// arriving after that, succeeds too.
var errReleasedLater = fmt.Errorf("%w after a failed unlock was retried", ErrReleased)
