package lock

import (
	"context"
	"errors"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// A hold's lifecycle. A hold changes state only through its transitions,
// and is asked about it only through its queries, all methods of the hold:
// here the ones every path shares; the first acquisition (establish) and a
// re-entry (addLevel) in levels.go; the end of a fixed lease (expireAt,
// extendTo) in hold.go, beside its timer; the outcome of a release
// (settle, released, releaseLater) in settle.go.
//
//	prepared ─establish─▶ held ─reentered─▶ held (one level more)
//	held ─handingOver / released─▶ released
//	held ─lose + end─▶ lost (the watchdog, a fixed lease's end, Redis
//	                         without the hold, a Close)
//	held, final release failed ─(settle)─▶ retrying ─reentered─▶ held
//
// A hold is used by an operation between use and unuse (the Client's table
// then keeps it), is entered (its semaphore) between enter and leave, and is
// registered as held between pin and unpin or lose.

// enter waits for h's semaphore or for ctx to end. A hold handed over ahead
// of its transfer (see handOverAhead) is entered once the transfer's
// outcome is known, or once the hold is known lost: every operation that
// enters a held hold may send h's field to Redis, and none may overtake the
// transfer; one that enters a lost hold answers ErrLost at once, without a
// word to Redis, however long the transfer's call still waits.
func (h *hold) enter(ctx context.Context) error {
	if err := h.landedOrLost(ctx); err != nil {
		return err
	}
	return h.sem.take(ctx)
}

// leave releases h's semaphore.
func (h *hold) leave() { h.sem.give() }

// landed waits until the transfer that handed h the lock, if it was sent
// after h's waiter was woken, has an outcome, or until ctx ends.
func (h *hold) landed(ctx context.Context) error {
	if p := h.inflight.Load(); p != nil {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// landedOrLost is landed, which returns early when h is known lost too.
func (h *hold) landedOrLost(ctx context.Context) error {
	if p := h.inflight.Load(); p != nil {
		select {
		case <-p.done:
		case <-p.lost:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// begin creates h's context at its first acquisition. It descends from ctx,
// carries the hold (for re-entries) and the token (for kinds that issue
// one), and with a fixed lease ends by itself when the lease runs out,
// measured from start (the moment the acquisition was sent, so the context
// never outlives the lock).
func (h *hold) begin(ctx context.Context, start time.Time) {
	h.parent = ctx
	hctx, cancel := context.WithCancelCause(ctx)
	h.cancel = cancel
	if h.fixed {
		h.expireAt(start.Add(h.lease))
	}
	first := h.carrier.h == nil
	inner := hctx
	if first {
		h.carrier = holdContext{hctx, h}
		hctx = &h.carrier
	} else {
		hctx = &holdContext{hctx, h}
	}
	if h.kind.tokens() {
		if first {
			h.tokenCtx = fencing.TokenContext{Context: hctx, Token: h.token}
			hctx = &h.tokenCtx
		} else {
			hctx = fencing.WithToken(hctx, h.token)
		}
	}
	h.ctx = hctx
	if first {
		h.detached = detachedContext{hctx, inner}
	}
}

// reentered is the transition of a re-entry of h that Redis accepted, sent
// at start: h, held, has one more level. A hold whose final release failed
// without being applied (see mayBeReleased) and is retried in the
// background (releaseLater) is the owner's again: it is held, the retry
// stops at its next turn, and unless its lease is fixed the watchdog renews
// it again, from the lease the re-entry set. Every re-entry of a held hold
// goes through it: a lock's own (addLevel) and a compound lock's of a
// hold its context carries (MultiLock, RedLock). The caller holds h's
// semaphore.
func (h *hold) reentered(start time.Time) {
	h.levels++
	if h.retrying {
		h.retrying = false
		h.retry++
		if !h.fixed {
			h.c.dog.add(&h.renewal, start.Add(h.lease))
		}
	}
}

// mayBeReleased reports whether h's final release failed with an unknown
// outcome and is retried in the background: the failed call may still land
// and remove the owner whatever count it has then, so h is not re-entered;
// a re-entry is answered as if h were released, and the retry goes on. The
// caller holds h's semaphore.
func (h *hold) mayBeReleased() bool { return h.retrying && h.unsure }

// renewalLost is how the watchdog reports that h's lock is lost: h is
// forgotten and its context ends with cause ErrLost.
func (h *hold) renewalLost(why string) {
	if h.lose() {
		h.c.opts.logger.WarnContext(h.logContext(context.Background()), "lock: a hold was lost; its context ends with ErrLost",
			"lock", h.name, "why", why)
		h.end(lostError(h.name, why))
	}
}

// abandon removes from Redis what is left of h after its lease ran out
// without a renewal getting through, within a second, once the transfer
// that handed h over, if still on its way, has an outcome: removed before
// it lands, h's field would be left by it.
func (h *hold) abandon() {
	ctx, cancel := h.c.backgroundContext(time.Second)
	defer cancel()
	if h.landed(ctx) == nil && h.enter(ctx) == nil {
		h.kind.undo(ctx, h, true)
		h.leave()
	}
}

// logContext is the context to log an event about h with, from a call made
// with ctx: once h is held, the context it was taken with (ended or not),
// so that a log handler finds the request's values there (trace and request
// ids) even for a background call, whose ctx has none; before, ctx.
func (h *hold) logContext(ctx context.Context) context.Context {
	switch {
	case h.parent != nil:
		return h.parent
	case ctx != nil:
		return ctx
	}
	return context.Background()
}

// use counts the caller as using h, a hold it knows already, until unuse;
// h may have been forgotten by its Client's table meanwhile.
func (h *hold) use() {
	t := &h.c.holds
	t.mu.Lock()
	h.refs++
	t.mu.Unlock()
}

// unuse ends one use of h; an unused hold that is not held is forgotten.
func (h *hold) unuse() {
	t := &h.c.holds
	t.mu.Lock()
	defer t.mu.Unlock()
	h.refs--
	if h.refs == 0 && !h.pinned && t.m[h.id] == h {
		delete(t.m, h.id)
	}
}

// pin records that h is held.
func (h *hold) pin() {
	t := &h.c.holds
	t.mu.Lock()
	h.pinned = true
	t.mu.Unlock()
}

// unpin records that h was released.
func (h *hold) unpin() {
	t := &h.c.holds
	t.mu.Lock()
	h.pinned = false
	if h.refs == 0 && t.m[h.id] == h {
		delete(t.m, h.id) // released by releaseLater, after its Unlock let go of it
	}
	t.mu.Unlock()
}

// held reports whether h is held: neither released nor lost.
func (h *hold) held() bool {
	t := &h.c.holds
	t.mu.Lock()
	defer t.mu.Unlock()
	return h.pinned
}

// isLost reports whether h was lost.
func (h *hold) isLost() bool {
	t := &h.c.holds
	t.mu.Lock()
	defer t.mu.Unlock()
	return h.lost
}

// lose records that h was lost and forgets it, so that the owner's next Lock
// starts afresh; the watchdog stops renewing it, and the calls waiting for
// the transfer that handed h over, if it is still on its way, stop waiting
// (see enter). It reports whether h was held until now; the caller then
// cancels h's context.
func (h *hold) lose() bool {
	h.c.dog.remove(&h.renewal)
	t := &h.c.holds
	t.mu.Lock()
	defer t.mu.Unlock()
	if !h.pinned {
		return false
	}
	h.pinned, h.lost = false, true
	if t.m[h.id] == h {
		delete(t.m, h.id)
	}
	if p := h.inflight.Load(); p != nil {
		p.lose()
	}
	return true
}

// end cancels h's context with cause.
func (h *hold) end(cause error) {
	h.c.ended(h, cause)
	h.cancel(cause)
	t := &h.c.holds
	t.mu.Lock()
	stop, expiry := h.stopLife, h.expiry
	h.stopLife, h.expiry = nil, nil
	t.mu.Unlock()
	if stop != nil {
		stop()
	}
	if expiry != nil {
		expiry.Stop()
	}
}

// lostErr is the error for an operation on h, which was lost.
func (h *hold) lostErr() error {
	if cause := context.Cause(h.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return wrap(h.name, ErrLost)
}

// lostBecause is the transition of a held hold found lost, why saying how:
// h is forgotten (see lose) and its context ends with cause ErrLost. It
// reports whether h was held until now: a hold already released or lost
// is left as it is.
func (h *hold) lostBecause(why string) bool {
	if !h.lose() {
		return false
	}
	h.end(lostError(h.name, why))
	return true
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

// prepare sets what a first acquisition of h through k with the options lo
// needs: its kind, and its lease, lo's (fixed: nothing renews it) or else the
// watchdog timeout of h's Client.
func (h *hold) prepare(k kind, lo lockOptions) {
	h.kind = k
	h.fixed = lo.lease > 0
	h.lease = h.c.opts.watchdogTimeout
	if h.fixed {
		h.lease = lo.lease
	}
}

// heldVia returns the hold ctx carries under hk when it is still held, or
// nil.
func heldVia(ctx context.Context, hk any) *hold {
	if h := heldBy(ctx, hk); h != nil && h.held() {
		return h
	}
	return nil
}

// dropOwner removes h's owner from Redis, whatever count it has there,
// within a second and even if ctx has ended: the hold ended while a call
// that added to it was on its way.
func (h *hold) dropOwner(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	levels := h.levels
	h.levels = 1 // a last level: every kind's release removes the owner whatever its count
	_, err := h.kind.release(rctx, h)
	h.levels = levels
	if err != nil {
		h.c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not remove a re-entry that came after its hold ended; it expires with its lease",
			"lock", h.name, "err", err)
	}
}

// levelContext returns the context of a re-entry of h made with ctx, which
// descends from h's context (or from a compound lock's context that ends with
// it) and so ends with the hold already: it only needs h's token when ctx
// carries another one.
func (h *hold) levelContext(ctx context.Context) context.Context {
	if !h.kind.tokens() {
		return ctx
	}
	if tok, _ := fencing.FromContext(ctx); tok != h.token {
		ctx = fencing.WithToken(ctx, h.token)
	}
	return ctx
}
