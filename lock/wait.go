package lock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/ctxend"
)

// A tryFunc tries to acquire once. It reports whether it acquired, and if
// not, how long the current holder's lease has left (the longest the caller
// should wait for an unlock message before trying again).
type tryFunc func(ctx context.Context) (ok bool, retry time.Duration, err error)

// A waitSpec describes one wait for a lock.
type waitSpec struct {
	name    string        // the lock's name, for errors
	channel string        // where the unlock messages are published; names the local queue
	wait    time.Duration // give up after this long (ErrNotAcquired); < 0 waits without bound
	lease   time.Duration // how long a lock taken by this Client lasts unless renewed
	shared  bool          // several owners may hold the lock: after one waiter got it, the next shared one tries at once
	// try makes one attempt; when nil, it is an attempt of h (c.attempt,
	// the time it was sent kept in h.start).
	try tryFunc

	// subscribe, when set, replaces subscribing channel on this Client: it
	// is called before each attempt of the queue's head and must make sure
	// the messages that wake the head are received from then on.
	subscribe func(ctx context.Context, q *waitQueue, deadline <-chan time.Time) error

	// eager makes the first attempt at once even when other goroutines of
	// this Client wait in the queue: the owner holds part of the lock
	// already (a compound lock re-entering one of its locks), and those
	// waiters may be waiting for it.
	eager bool

	// h, when set, is the single-key hold the wait is for. When its kind can
	// hand over (handing), a releasing holder of this Client may hand h the
	// lock instead of an attempt succeeding (h.granted records it), and the
	// head's first look after it let other Clients go first (see yieldDelay
	// and turnStagger) is the kind's cheap probe of whether the lock is
	// free rather than an attempt.
	h *hold
}

// waitFor calls s.try until it acquires, s.wait runs out (ErrNotAcquired),
// ctx ends, or the Client closes. Waiting is pushed: the head waits for an
// unlock message on the lock's channel, bounded by the remaining lease the
// last attempt reported (and, after another waiter of this Client took the
// lock, by s.lease); nothing polls.
//
// A wait that has to queue is a small state machine (see waitStep): it
// looks at its waiter's state, takes its turn to try when it is the head
// and was told to, and sleeps until something changes.
//
// Its error is the outcome as it came (ErrNotAcquired, ErrClosed, ctx's
// error, a Redis error, or an attempt's own): the caller makes it the
// lock's error with acquireErr. A failed wait for a hold leaves no place in
// a wait line behind (forgetIfFailed).
func (c *engine) waitFor(ctx context.Context, s waitSpec) (err error) {
	if s.h != nil {
		defer c.forgetIfFailed(ctx, s.h, &err)
	}
	var prober handing
	queue, enlist, also := s.channel, false, ""
	if s.h != nil {
		prober, _ = s.h.kind.(handing)
		if l, ok := s.h.kind.(lineWaker); ok {
			also = l.alsoWokenBy()
		}
		if l, ok := s.h.kind.(laned); ok {
			queue, enlist = s.channel+l.lane(), true
		}
	}
	var called time.Time // s.wait counts from the call, not from after the first attempt
	if s.wait > 0 {
		called = time.Now()
	}
	if s.wait == 0 || s.eager || !c.queued(queue) && !c.heldBack(s.channel) {
		// Nobody of this Client is waiting, and no foreign waiter goes
		// first (see foreignYield): try at once, without queueing.
		ok, _, err := c.tryOnce(ctx, &s)
		if err != nil || ok {
			return err
		}
		if s.wait == 0 {
			return ErrNotAcquired
		}
	}

	wt := &waitRun{c: c, ctx: ctx, s: s, prober: prober, queue: queue}
	if s.wait > 0 {
		t := time.NewTimer(max(s.wait-time.Since(called), 0))
		defer t.Stop()
		wt.deadline = t.C
	}
	wt.timer = time.NewTimer(time.Hour)
	wt.timer.Stop()
	defer wt.timer.Stop()

	wt.q, wt.w = c.join(wt.queue, s.channel, s.shared, enlist, s.h)
	if also != "" {
		c.alsoWokenBy(wt.q, also)
	}
	defer func() { c.leaveQueue(wt.q, wt.w, wt.acquired, s.lease) }()

	step := stepLook
	for step != stepDone {
		switch step {
		case stepLook:
			step = wt.look()
		case stepTurn:
			step, err = wt.turn()
		case stepSleep:
			step, err = wt.sleep()
		case stepGrant:
			step = wt.take()
		}
	}
	return err
}

// forgetIfFailed undoes the place in a wait line in Redis that h's owner
// took, when the wait for h failed (*err is set): nobody will take it.
func (c *engine) forgetIfFailed(ctx context.Context, h *hold, err *error) {
	if *err != nil && h.queued {
		c.forget(ctx, h, false)
	}
}

// tryOnce makes one attempt of s: s.try, or else an attempt of s.h, the
// time it was sent kept in h.start.
func (c *engine) tryOnce(ctx context.Context, s *waitSpec) (bool, time.Duration, error) {
	if s.try != nil {
		return s.try(ctx)
	}
	s.h.start = time.Now()
	return c.attempt(ctx, s.h)
}

// A waitRun is one queued wait of waitFor: its spec, its waiter, and what
// it has learned so far.
type waitRun struct {
	c      *engine
	ctx    context.Context
	s      waitSpec
	prober handing // the kind that probes: a hold's that can hand over
	queue  string  // the name of the local queue (see laned)

	q        *waitQueue
	w        *waiter
	deadline <-chan time.Time // s.wait ran out; nil without bound
	timer    *time.Timer      // the head's bound
	probe    bool             // the turn looks whether the lock is free before trying
	acquired bool             // for leaveQueue
}

// look reads the waiter's state and says what to do next.
func (wt *waitRun) look() waitStep {
	step, probe, bound := wt.c.look(wt.q, wt.w, wt.prober != nil)
	wt.probe = probe
	if bound >= 0 {
		wt.timer.Reset(bound)
	}
	return step
}

// takingGrant, when set (by a test), runs as a waiter that was handed the
// lock wakes up, before it takes the grant: a stand-in for a goroutine the
// scheduler leaves waiting on a loaded machine.
var takingGrant func()

// take takes the lock a releaser of this Client handed over to the waiter.
func (wt *waitRun) take() waitStep {
	if takingGrant != nil {
		takingGrant()
	}
	c, w, h := wt.c, wt.w, wt.s.h
	at, tok, top := c.grantOf(w)
	if !c.grantLasts(h, at) {
		// Its lease ran out before this goroutine ran, or the transfer sent
		// after it was woken failed: the lock may be someone else's by now.
		// What is left of it goes, and the head tries afresh.
		c.dropGrant(wt.ctx, h)
		c.refuseGrant(w)
		return stepLook
	}
	wt.acquired = true
	h.granted(at, tok, top)
	return stepDone
}

// grantLasts reports whether the lock handed over to h, its lease begun at
// at, is still h's to take: its fixed lease has not run out, or the
// watchdog has watched it since the handover (see handOff and pend) and it
// has more than the watchdog's margin left, and its transfer, when sent
// after the waiter was woken (see handOverAhead), has not failed. Otherwise
// the watchdog no longer renews it.
func (c *engine) grantLasts(h *hold, at time.Time) bool {
	if h.fixed {
		return time.Now().Before(at.Add(h.lease))
	}
	if p := h.inflight.Load(); p != nil {
		if settled, ok, _ := p.outcome(); settled && !ok {
			return false
		}
	}
	return c.dog.claim(&h.renewal)
}

// dropGrant undoes a handover to h that its waiter does not take: once its
// transfer, if still on its way, has an outcome, nothing renews h and
// whatever Redis holds of it goes.
func (c *engine) dropGrant(ctx context.Context, h *hold) {
	h.awaitTransfer()
	if !h.fixed {
		c.dog.remove(&h.renewal)
	}
	h.kind.undo(context.WithoutCancel(ctx), h, true)
}

// turn is the head's turn to try: it subscribes first, so that an unlock
// between a failed attempt and the subscription cannot go unnoticed, then
// tries (or probes), and on failure sleeps for the remaining lease it
// learned.
func (wt *waitRun) turn() (waitStep, error) {
	c, ctx, w := wt.c, wt.ctx, wt.w
	var err error
	if wt.s.subscribe != nil {
		err = wt.s.subscribe(ctx, wt.q, wt.deadline)
	} else {
		err = c.awaitSubscription(ctx, wt.q, wt.deadline)
	}
	if err != nil {
		// A handover may have reached this waiter meanwhile: it holds
		// then, unless the caller is gone (its context, or the Client,
		// ended).
		return stepDone, wt.giveUp(err, !ctxend.Ended(ctx) && !errors.Is(err, ErrClosed))
	}
	// A handover to this waiter and its own attempt exclude each other:
	// both would make it the holder, each with a token of its own.
	if !c.startTrying(w) {
		return stepLook, nil // handed over, or about to be: wait for the outcome
	}
	ok, free, r := false, true, time.Duration(0)
	if wt.probe {
		free, r, err = wt.prober.probe(ctx, wt.s.h)
	}
	if err == nil && free {
		ok, r, err = c.tryOnce(ctx, &wt.s)
	}
	c.tried(wt.q, w, ok)
	switch {
	case err != nil:
		return stepDone, wt.giveUp(err, false)
	case ok:
		wt.acquired = true
		return stepDone, nil
	}
	// Held: wait for its unlock message, at most as long as its lease
	// (after a look, or after an attempt) has left; an attempt that knows
	// no bound (r < 0) waits for the message alone.
	if !free || r >= 0 {
		wt.timer.Reset(r)
	}
	return stepSleep, nil
}

// sleep waits until something the wait depends on changes. A wait that
// has run out ends, even when a wake-up came at the same time: an attempt
// that takes long (a slow link) could otherwise be made again and again
// past the caller's wait.
func (wt *waitRun) sleep() (waitStep, error) {
	c, ctx := wt.c, wt.ctx
	select {
	case <-wt.deadline:
		return wt.ranOut()
	default:
	}
	select {
	case <-wt.w.notify:
		return stepLook, nil
	case <-wt.timer.C:
		c.boundRanOut(wt.w)
		return stepLook, nil
	case <-wt.deadline:
		return wt.ranOut()
	case <-ctx.Done():
		return stepDone, wt.giveUp(ctx.Err(), false)
	case <-c.done:
		return stepDone, wt.giveUp(ErrClosed, false)
	}
}

// ranOut ends a wait whose time ran out.
func (wt *waitRun) ranOut() (waitStep, error) {
	if ctxend.Ended(wt.ctx) { // both ended: the caller's end wins, never "busy"
		return stepDone, wt.giveUp(wt.ctx.Err(), false)
	}
	return stepDone, wt.giveUp(ErrNotAcquired, true)
}

// giveUp ends the wait with err, unless the lock was handed over meanwhile:
// a wait that ran out (keep) then succeeds after all, if the lease the
// handover began still lasts (grantLasts); a caller whose context ended, or
// a closed Client, gets the lock released.
func (wt *waitRun) giveUp(err error, keep bool) error {
	if at, tok, top, ok := wt.c.withdraw(wt.w); ok {
		h := wt.s.h
		if keep && wt.c.grantLasts(h, at) {
			wt.acquired = true
			h.granted(at, tok, top)
			return nil
		}
		wt.c.dropGrant(wt.ctx, h)
	}
	return err
}

// A lineWaker is a kind whose waiters stand in a line in Redis and are also
// woken, when first in line, by the unlock messages of another channel (see
// lineWake): a FairMutex's, by its Mutex's.
type lineWaker interface {
	kind
	alsoWokenBy() string
}

// attempt runs one acquisition attempt of h, with the replica
// acknowledgement h asks for. An attempt whose outcome is unknown (the call
// may have been applied and only its reply lost, or the caller gave up while
// it was under way) is undone, so that a lock nobody knows it holds does not
// block everyone until its lease ends.
func (c *engine) attempt(ctx context.Context, h *hold) (bool, time.Duration, error) {
	var via processor = c.rdb
	var conn *redis.Conn
	if h.ack.replicas > 0 {
		var err error
		if conn, err = c.conn(ctx, h.id.key); err != nil {
			return false, 0, c.attemptFailed(ctx, h, err)
		}
		defer conn.Close()
		via = conn
	}
	ok, retry, err := h.kind.attempt(ctx, via, h)
	if err != nil {
		return false, 0, c.attemptFailed(ctx, h, err)
	}
	if ok && conn != nil {
		if err := c.confirmReplicas(ctx, conn, h.ack); err != nil {
			c.forget(ctx, h, true)
			return false, 0, err
		}
	}
	if ok && h.lapsed(time.Now()) {
		// The reply came after the lease it set had run out, counted from
		// when the attempt was sent (h.start): the key may be gone, or
		// anyone's by now. Not an acquisition: what is left of it goes, and
		// the lock, free a moment ago, is tried again at once.
		c.forget(ctx, h, true)
		return false, 0, nil
	}
	return ok, retry, nil
}

// lapsed reports whether the lease of h's first acquisition, sent at
// h.start, has run out at now: a fixed lease by its end, a watchdog's
// lease by the watchdog's margin before it, when the watchdog would
// declare it lost at once (see expireOverdue).
func (h *hold) lapsed(now time.Time) bool {
	end := h.start.Add(h.lease)
	if !h.fixed {
		end = end.Add(-h.c.dog.expiryMargin())
	}
	return !now.Before(end)
}

// attemptFailed handles an attempt that failed with err.
func (c *engine) attemptFailed(ctx context.Context, h *hold, err error) error {
	if outcomeUnknown(err) {
		c.forget(ctx, h, true)
	}
	return err
}

// forget undoes what an acquisition of h that did not complete may have left
// in Redis, within a second and even if ctx has ended.
func (c *engine) forget(ctx context.Context, h *hold, acquired bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if h.queued {
		c.dog.remove(h.waiting)
	}
	h.kind.undo(rctx, h, acquired)
	h.queued = false
}
