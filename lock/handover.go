package lock

import (
	"context"
	"runtime"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// Handovers: a releasing holder gives the lock straight to the next waiter
// of its Client (transfer.lua), without freeing it, in turns bounded by
// cohortLimit so that the other Clients get the lock too.

// handOver releases h's last level by handing the lock to waiter w. until,
// when set, is when h's lease ends unless the watchdog renews it: a waiter
// the watchdog renews too keeps that lease when enough of it is left,
// rather than have the handover set it anew, and when h has a token left in
// its block for w too, w is woken before the transfer is sent
// (handOverAhead).
func (c *engine) handOver(ctx context.Context, h *hold, w *waiter, until time.Time, renewed bool) error {
	at := time.Now()
	lease := w.h.lease
	if !until.IsZero() && !w.h.fixed && w.h.lease == h.lease && until.Sub(at) > lease/2 {
		at, lease = until.Add(-lease), 0
		if tok, top, ok := reservedNext(h); ok {
			return c.handOverAhead(ctx, h, w, at, tok, top, renewed)
		}
	}
	tok, top, err := h.kind.(handing).transfer(context.WithoutCancel(ctx), h, w.h, lease)
	switch {
	case err != nil:
		if outcomeUnknown(err) {
			// Maybe handed over, maybe still on its way: free the lock,
			// rather than leave it held for a waiter that does not know,
			// and remove h's field with it, so that a transfer arriving
			// later finds nothing to hand over.
			if c.abortTransfer(ctx, h, w.h) == nil {
				c.handedOver(w, false, at, 0, 0, nil)
				return c.settle(h, renewed, 0, nil)
			}
		}
		c.handedOver(w, false, at, 0, 0, nil)
		return c.settle(h, renewed, 0, err)
	case tok < 0:
		c.handedOver(w, false, at, 0, 0, nil)
		return c.settle(h, renewed, -1, nil)
	}
	if !w.h.fixed {
		// Renewed from now on, not from when w's goroutine runs: on a
		// loaded machine that can be after the lease.
		w.h.setRenewal()
		c.dog.handOff(&w.h.renewal, at.Add(w.h.lease))
	}
	// h's context ends, and the handover is told, before w runs.
	h.handingOver()
	c.observe(h, EventHandedOver, 0, nil)
	c.handedOver(w, true, at, tok, top, nil)
	return c.handedOn(h, renewed)
}

// handOverAhead is handOver when w keeps the lease h was renewed with (its
// lease began at at) and takes its token from h's block (tok, top): nothing
// w is given waits for Redis, so w is woken first and runs while the
// transfer is on its way, on h's lease, which has more than half of it left
// (the lock stays h's in Redis until the transfer lands, and nobody else can
// take it). On a hot key that takes the transfer's round trip off the
// critical path, where a handover otherwise costs the next holder one.
//
// Until the outcome is known, w's hold is in flight (see inflightHandover):
// every call on it that reaches Redis waits for the transfer first, and the
// watchdog watches its lease without renewing it (see pend); a hold the
// watchdog declares lost at its lease end answers at once. When the
// transfer fails, a waiter that has not taken the grant yet tries afresh;
// one that has is told, as of any loss: its context ends with ErrLost
// (before its Lock returns, if the failure comes first), and its fencing
// token (from h's block, below every token issued after the block) is
// refused by the writes of whoever holds the lock next. h's release is
// decided as w is woken: h's context has ended by then.
func (c *engine) handOverAhead(ctx context.Context, h *hold, w *waiter, at time.Time, tok, top fencing.Token, renewed bool) error {
	p := &inflightHandover{done: make(chan struct{}), lost: make(chan struct{})}
	until := at.Add(w.h.lease)
	w.h.setRenewal()
	c.dog.pend(&w.h.renewal, until)
	// h's context ends, and the handover is told, before the waiter runs,
	// so that the new holder's events follow it; a transfer that then
	// finds the lock gone is told as h's loss.
	h.handingOver()
	c.observe(h, EventHandedOver, 0, nil)
	c.handedOver(w, true, at, tok, top, p)
	k := h.kind.(handing)
	// Of no use after w's lease, when the lock has expired and w was told
	// it lost it: the transfer's calls end then (for a go-redis client that
	// heeds contexts while it waits for a reply, ContextTimeoutEnabled; a
	// resend is not sent after it).
	bg, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	got, _, err := k.transfer(bg, h, w.h, 0)
	if err != nil && outcomeUnknown(err) {
		// Maybe applied, maybe not (yet): a copy sent again is answered
		// alike either way (transfer.lua), and w, running already, keeps
		// the lock when it gets through.
		got, _, err = k.transfer(bg, h, w.h, 0)
		if err != nil {
			// Neither copy is known to have landed, and the first may
			// land yet. w is told first, and the lock is freed (the abort
			// removes both fields; a copy landing after it finds the
			// releaser's gone) before w's hold can be entered again:
			// otherwise a waiter that tries afresh with the same field
			// could have its new hold removed by the abort.
			lost := c.transferFailed(w.h, p, true)
			aerr := c.abortTransfer(ctx, h, w.h)
			c.transferEnded(w.h, p, lost, aerr != nil)
			if aerr == nil {
				return c.settle(h, renewed, 0, nil)
			}
			return c.settle(h, renewed, 0, err)
		}
	}
	switch {
	case err != nil: // not applied
		c.transferEnded(w.h, p, c.transferFailed(w.h, p, false), false)
		return c.settle(h, renewed, 0, err)
	case got < 0: // the releaser's field was gone: nothing changed
		c.transferEnded(w.h, p, c.transferFailed(w.h, p, false), false)
		return c.settle(h, renewed, -1, nil)
	}
	p.record(true, false)
	c.dog.landed(&w.h.renewal)
	close(p.done)
	if w.h.isLost() {
		// Declared lost at its lease end, the transfer landing later
		// (before the lock expired): what it left goes.
		c.goBackground(w.h.abandon)
	}
	return c.handedOn(h, renewed)
}

// handedOn completes h's release by a handover that succeeded.
func (c *engine) handedOn(h *hold, renewed bool) error {
	err := c.settle(h, renewed, 0, nil)
	// The new holder runs first, as sync.Mutex hands over when starving:
	// on a hot key the handovers are the critical path, and whatever the
	// releaser does next (answer its request, take the next one) would
	// otherwise keep its P, and the new holder waiting, until it blocks.
	runtime.Gosched()
	return err
}

// abortTransfer frees the lock after a transfer from h to to whose outcome
// is unknown (see handing.abort), within a second.
func (c *engine) abortTransfer(ctx context.Context, h, to *hold) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	return h.kind.(handing).abort(rctx, h, to)
}

// reservedNext returns the token the holder h hands its lock to gets from
// h's block (see tokenBlock) and the block's last, when h has one left.
func reservedNext(h *hold) (tok, top fencing.Token, ok bool) {
	if h.top > h.token {
		return h.token + 1, h.top, true
	}
	return 0, 0, false
}

// transferFailed records that p, the transfer to h sent after h's waiter was
// woken, failed; stray says that the lock may still carry h's field (a
// transfer of unknown outcome). Nothing renews h from then on, and a hold
// already returned by Lock is lost: it reports whether h was, for
// transferEnded to tell once whatever the failure needs is done.
func (c *engine) transferFailed(h *hold, p *inflightHandover, stray bool) bool {
	p.record(false, stray)
	return h.lose() // and its renewal goes, held or not
}

// transferEnded lets h's hold be entered again after a failed transfer (see
// transferFailed), and tells a lost hold its cause; stray says that h's
// field may be left in the lock, which then goes.
func (c *engine) transferEnded(h *hold, p *inflightHandover, lost, stray bool) {
	close(p.done)
	if lost {
		h.end(lostError(h.name, "the handover to it did not reach Redis"))
		if stray {
			c.goBackground(h.abandon)
		}
	}
}

// adoptHandover is establish's end of a handover to h (see handOff and
// handOverAhead): it reports whether h is still held. A hold whose transfer
// failed is not, and what the transfer may have left of it goes.
func (c *engine) adoptHandover(h *hold) bool {
	if p := h.inflight.Load(); p != nil {
		if settled, ok, stray := p.outcome(); settled && !ok {
			if stray {
				c.goBackground(h.abandon)
			}
			return false
		}
	}
	return c.dog.adopt(&h.renewal)
}

// awaitTransfer waits for the transfer that handed h the lock, when h's
// waiter was woken before it was sent (see handOverAhead), and then forgets
// it: for a waiter that gives the handover up and undoes it.
func (h *hold) awaitTransfer() {
	if p := h.inflight.Load(); p != nil {
		<-p.done
		h.inflight.Store(nil)
	}
}

// setRenewal sets h's renewal (once: a renewal round under way may still
// read it). Every kind that takes holds of one role on one key renews them
// alike.
func (h *hold) setRenewal() {
	if h.renewal.script == nil {
		h.renewal.script, h.renewal.keys, h.renewal.args = h.kind.renewal(h)
	}
}

// granted records that a releasing holder of this Client handed h the lock:
// h's lease began at at, its token is tok and top the last one reserved.
// The watchdog renews it already, unless its lease is fixed (see handOff).
func (h *hold) granted(at time.Time, tok, top fencing.Token) {
	h.start, h.token, h.top = at, tok, top
	h.handed = !h.fixed
}

// cohortLimit bounds how many times in a row a lock is handed from one
// holder of a Client straight to the next waiter of the same Client: a
// Client's turn serves at most cohortLimit+1 holders, 16. Handing over saves
// the unlock message and the race that follows it, so a hot lock moves
// inside one process at the cost of one round trip; the bound makes the
// Client free the lock regularly, so that the waiters of other Clients
// (other instances of the service) get their turn.
//
// A turn costs Redis about 12 commands (the release and its message, the
// next Client's acquisition, the others' PTTL looks, now and then a count
// of the listeners), a handover 3, so a longer turn costs Redis less per
// acquisition and keeps the other Clients waiting longer. 16 holders a turn
// is where the hot-key runs of the benchmarks had both the fewest commands
// per acquisition and the shortest p99 wait among the lengths tried (the
// figures: "Turn lengths" in docs/BENCHMARKS.md).
const cohortLimit = 15

// tokenBlock is how many fencing tokens a Mutex's acquisition reserves, its
// own included: the holders it hands the lock to in a run of handovers take
// the next ones without a command to issue them (see issue_token in
// lib.lua). A run longer than that (no other Client waits) reserves another
// block. acquire.lua has the number written in (an argument costs Redis more
// on every acquisition; a RedLock's nodes reserve the block too, unused);
// TestMutex_AcquisitionReservesTheTokenBlock holds the two together.
const tokenBlock = cohortLimit + 1

// turnStagger orders the Clients that race for a lock freed at the end of a
// turn. Redis tells every subscriber of the unlock channel at once, and
// which one's attempt lands first is down to scheduling: left to that, two
// Clients can take turns while a third waits through many. A Client counts
// the turns it hears end after its own; one that has heard fewer than there
// are other Clients holds back turnStagger for each turn it is short, so the
// Client that waited longest tries first and the others, arriving later,
// look with one PTTL instead of a failed attempt.
const turnStagger = 200 * time.Microsecond
