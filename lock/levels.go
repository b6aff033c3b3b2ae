package lock

import (
	"context"
	"errors"
	"time"
)

// The two ways a single-key acquisition takes a level of a hold, as
// engine.acquire chooses: the first level of a hold of its own
// (firstLevel: wait for the lock, then establish), or one level more of
// the hold its context carries (addLevel). Each reports what happened as
// it came; engine.acquire makes it the caller's error.

// firstLevel takes h, a hold of an acquisition of its own, through k:
// it waits for the lock (waitFor) for wait at most (< 0: without bound),
// then makes h held (establish) and ties it to ctx's end. The caller uses
// h (see use); firstLevel ends that use. An error is the outcome as it
// came (see engine.acquire).
func (h *hold) firstLevel(ctx context.Context, k kind, wait time.Duration, lo lockOptions) (context.Context, error) {
	defer h.unuse()
	if err := h.enter(ctx); err != nil {
		return ctx, err
	}
	defer h.leave()
	h.prepare(k, lo)
	h.top = 0
	h.ack = lo.ack
	c := h.c
	var called time.Time // for the Observer only: a clock read less per Lock without one
	if c.opts.observer != nil {
		called = time.Now()
	}
	err := c.waitFor(ctx, waitSpec{name: h.name, channel: k.channel(h), wait: wait, lease: h.lease, shared: k.shared(), h: h})
	if err != nil {
		return ctx, err // waitFor has undone what the acquisition left (see forget)
	}
	if c.opts.observer != nil {
		c.observeIn(ctx, h, EventAcquired, time.Since(called), nil)
	}
	h.establish(ctx, h.start)
	h.tieToParent()
	return h.ctx, nil
}

// establish makes h held after its first acquisition, which was sent at
// start. The caller then ties it to ctx's end (tieToParent), unless a
// compound lock releases it with its other locks.
func (h *hold) establish(ctx context.Context, start time.Time) {
	c := h.c
	if h.queued {
		c.dog.remove(h.waiting)
		h.queued = false
	}
	h.levels = 1
	h.unsure = false
	h.ended = false
	h.begin(ctx, start)
	h.pin()
	switch {
	case h.fixed:
	case !h.handed:
		h.setRenewal()
		c.dog.add(&h.renewal, start.Add(h.lease))
	default:
		h.setRenewal()
		if !c.adoptHandover(h) {
			h.lostBecause("it was lost right after it was handed over")
		}
	}
	h.handed = false
	if c.closed() && h.lose() {
		h.end(closedError(h.name))
	}
	if cause := context.Cause(h.ctx); h.fixed && errors.Is(cause, ErrLost) && h.lose() {
		h.end(cause) // its lease ran out before it was pinned (see expireAt)
	}
}

// addLevel re-enters h, which ctx holds already: one level more. A re-entry never
// weakens the hold it enters: it never shortens the lease and never turns
// the watchdog off. A lease > 0 (WithLease) extends a fixed hold to at
// least lease from this call (its context then ends at the later of the two
// deadlines) and does nothing to a hold the watchdog renews. Without one
// the hold keeps its lease as it is (a fixed one its deadline). An error is
// the outcome as it came (see engine.acquire).
func (h *hold) addLevel(ctx context.Context, lease time.Duration) (context.Context, error) {
	h.use()
	defer h.unuse()
	if err := h.enter(ctx); err != nil {
		return ctx, err
	}
	defer h.leave()
	switch {
	case h.isLost():
		return ctx, h.lostErr()
	case h.levels == 0 || !h.held() || h.mayBeReleased():
		// Released a moment ago, or its release may still land: ctx ends
		// with it.
		return ctx, wrap(h.name, ErrReleased)
	}
	if !h.fixed {
		lease = 0 // the watchdog renews the hold: a lease would only weaken it
	}
	start := time.Now()
	h.relet = lease
	ok, err := h.kind.reenter(ctx, h)
	h.relet = 0
	switch {
	case err != nil:
		// An unknown outcome needs no rollback: the final release removes
		// the owner whatever count Redis holds.
		return ctx, err
	case !ok:
		h.lostBecause("its hold was gone when it was re-entered")
		return ctx, h.lostErr()
	}
	h.reentered(start) // a hold whose release failed, not applied, is the owner's again
	if lease > 0 {
		h.extendTo(start.Add(lease))
	}
	if !h.held() {
		// Its lease ran out while the re-entry was on its way: the hold has
		// ended and its owner was told, so the level the re-entry added (and
		// the lease it may have stretched in Redis) must not keep the lock
		// held by nobody.
		h.dropOwner(ctx)
		return ctx, h.lostErr()
	}
	return h.levelContext(ctx), nil
}
