package lock

// A waiter's state in its queue, as its wait (waitRun, wait.go) reads and
// changes it, and the lines' side of a handover to it: each method takes
// the lines' qmu.

import (
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// A waitStep is what a queued wait does next.
type waitStep uint8

const (
	// stepLook reads the waiter's state: the lock handed over (done), its
	// turn to try (stepTurn), or a bound to sleep with (stepSleep).
	stepLook waitStep = iota
	// stepTurn subscribes and tries, or probes first (see handing.probe).
	stepTurn
	// stepSleep waits for a wake-up, the bound, the deadline, the end of
	// ctx or the Client's Close.
	stepSleep
	// stepGrant takes the lock a releaser of this Client handed over.
	stepGrant
	stepDone
)

// look reads the state of w, a waiter of q, for its wait (see waitRun.look):
// the step it takes next, whether its turn looks whether the lock is free
// before trying (only when canProbe: its kind can), and the bound to sleep
// with (< 0: none).
func (c *lines) look(q *waitQueue, w *waiter, canProbe bool) (waitStep, bool, time.Duration) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if w.granted {
		return stepGrant, false, -1
	}
	head, tryNow, bound := w.head, w.tryNow, w.bound
	w.tryNow, w.bound = false, -1
	probe := false
	if head && tryNow && !q.yield.IsZero() {
		if wait := time.Until(q.yield); wait > 0 {
			tryNow, bound = false, wait // other Clients first
		} else {
			// The others had their head start; most likely one of them
			// holds the lock now, and its unlock message will come.
			q.yield = time.Time{}
			probe = canProbe
		}
	}
	switch {
	case head && tryNow:
		return stepTurn, probe, -1
	case head && bound >= 0:
		return stepSleep, probe, bound
	}
	return stepSleep, probe, -1
}

// grantOf returns what the handover to w gave it: when its lease began, its
// token and the last token reserved for it.
func (c *lines) grantOf(w *waiter) (time.Time, fencing.Token, fencing.Token) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return w.grantAt, w.grantTok, w.grantTop
}

// refuseGrant records that w does not take the lock handed over to it: it
// tries afresh when it is the head.
func (c *lines) refuseGrant(w *waiter) {
	c.qmu.Lock()
	w.granted, w.tryNow = false, w.head
	c.qmu.Unlock()
}

// startTrying marks w as trying to acquire by itself, unless a handover to
// it is under way or done (false): both would make it the holder, each with
// a token of its own.
func (c *lines) startTrying(w *waiter) bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if w.reserved || w.granted {
		return false
	}
	w.trying = true
	return true
}

// tried ends w's own attempt (see startTrying): one that acquired (ok) took
// the lock in a race, and a new run of handovers on q may start.
func (c *lines) tried(q *waitQueue, w *waiter, ok bool) {
	c.qmu.Lock()
	if ok {
		q.handoffs = 0
	} else {
		w.trying = false
	}
	c.qmu.Unlock()
}

// boundRanOut records that the bound w slept with ran out: it tries when it
// is the head.
func (c *lines) boundRanOut(w *waiter) {
	c.qmu.Lock()
	w.tryNow = w.head
	c.qmu.Unlock()
}

// reserveHandover picks the waiter of this Client that h's lock can be handed
// to at its final release: the head of its queue, waiting for the same lock
// through a kind that can hand over. The caller then completes the handover
// with handedOver. After cohortLimit handovers in a row there is none, and
// turn reports that the Client's turn is over: the caller frees the lock
// and calls endTurn.
func (c *lines) reserveHandover(h *hold) (w *waiter, turn bool) {
	if _, ok := h.kind.(handing); !ok {
		return nil, false
	}
	if c.nqueue.Load() == 0 {
		return nil, false // nobody of this Client waits anywhere (see queued)
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queues[h.kind.channel(h)]
	if q == nil || len(q.waiters) == 0 {
		return nil, false
	}
	if q.handoffs >= cohortLimit {
		return nil, true
	}
	w = q.waiters[0]
	if w.h == nil || w.reserved || w.granted || w.leaving || w.trying || w.h.id.key != h.id.key || w.h.ack.replicas > 0 {
		return nil, false
	}
	if _, ok := w.h.kind.(handing); !ok {
		return nil, false
	}
	w.reserved = true
	q.handoffs++
	return w, false
}

// handedOver completes a handover to w reserved by reserveHandover: when it
// succeeded, or is on its way (p, see handOverAhead), w is woken holding the
// lock (at: when w's lease began; tok and top: the token it gave w and the
// last one reserved); otherwise w tries to acquire at once.
func (c *lines) handedOver(w *waiter, ok bool, at time.Time, tok, top fencing.Token, p *inflightHandover) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	w.reserved = false
	if p != nil {
		w.h.inflight.Store(p)
	}
	if ok {
		w.granted, w.grantAt, w.grantTok, w.grantTop = true, at, tok, top
	} else {
		w.tryNow = w.head
	}
	signal(w)
}

// withdraw takes w out of the handovers as it gives up: it waits for a
// handover under way to w to finish and reports whether the lock was handed
// to w (when and with which token).
func (c *lines) withdraw(w *waiter) (time.Time, fencing.Token, fencing.Token, bool) {
	c.qmu.Lock()
	w.leaving = true
	for w.reserved {
		c.qmu.Unlock()
		<-w.notify
		c.qmu.Lock()
	}
	defer c.qmu.Unlock()
	return w.grantAt, w.grantTok, w.grantTop, w.granted
}
