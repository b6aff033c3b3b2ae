package lock

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// renewChunk is how many locks one renewal script call extends.
	renewChunk = 512
	// renewCallsPerRoundTrip is how many renewal script calls share one
	// pipelined round trip.
	renewCallsPerRoundTrip = 64
)

// The watchdog renews every lock its Client holds without a fixed lease: one
// loop per Client, not a goroutine per lock. Every timeout/3 it extends all
// of them in batches — one script call per renewChunk locks of one hash slot,
// pipelined — and a lock found gone cancels its holder's context with ErrLost
// at once. When Redis cannot be reached the renewals are retried until a
// lock's lease would have run out; then that lock is declared lost too.
type watchdogLoop struct {
	c      *link
	period time.Duration

	mu      sync.Mutex
	holds   map[*renewal]struct{}
	running bool
	idle    bool          // no pass runs or is scheduled: nothing was held at the last one
	armed   time.Time     // when the expiry timer fires (see armExpiry); zero until the loop first sets it
	kick    chan struct{} // capacity 1: a hold was added that the loop must learn of (see add)
	kicks   atomic.Int64  // kicks sent, for tests: an uncontended Lock+Unlock sends none
}

// A renewal is one held lock as the watchdog sees it. Locks of every kind
// share the loop: each brings a batch script that renews many locks at once,
// with KEYS the keys of each lock in turn and ARGV[1] the lease in
// milliseconds followed by the arguments of each lock in turn.
type renewal struct {
	script *script
	keys   []string // this lock's keys, all in one hash slot
	args   []any    // this lock's arguments
	// owner is the hold this renews, or nil for a place in a wait line,
	// which has lost instead.
	owner *hold
	lost  func(why string)

	until time.Time // guarded by watchdog.mu: when the lease ends unless renewed
	// handed, guarded by watchdog.mu: added at a handover, and its waiter
	// has not taken the lock yet (see handOff): a loss meanwhile only
	// drops it, and the waiter finds it gone when it claims it.
	handed bool
	// pending, guarded by watchdog.mu: a hold handed over ahead of its
	// transfer (see pend): not renewed until the transfer landed.
	pending bool
	// owed, guarded by watchdog.mu: a pass found the pending hold due and
	// passed it over; its landing renews it at once (see landed).
	owed bool
}

// fail reports that the lock or the place r renews is lost, for why.
func (r *renewal) fail(why string) {
	if r.owner != nil {
		r.owner.renewalLost(why)
		return
	}
	r.lost(why)
}

func newWatchdog(c *link) *watchdogLoop {
	return &watchdogLoop{
		c:      c,
		period: c.opts.watchdogTimeout / 3,
		holds:  make(map[*renewal]struct{}),
		kick:   make(chan struct{}, 1),
	}
}

// add starts renewing h, whose lease runs until until. The script answers 1
// for each lock it renewed and 0 for each lock it found gone; h.lost is then
// called, outside the watchdog's lock. h is declared lost by until (less
// expiryMargin) even if no renewal pass ever gets an answer: a hold cut off
// right after it was taken is told by its lease end, not when go-redis
// gives up. So the loop is woken when its expiry timer would fire too late
// for h or not at all, and when no pass is scheduled; otherwise the timer
// fires first, and re-arms itself for h among the others (a hold of the
// usual lease, added after the others, needs no wake-up).
func (w *watchdogLoop) add(h *renewal, until time.Time) { w.enlist(h, until, false, false) }

// handOff starts renewing h, the hold a releaser has just handed the lock
// to, whose lease runs until until: from the handover on, however late its
// waiter's goroutine runs. Until the waiter claims it, h is not told of a
// loss (its owner is not held yet): the loss only stops its renewals.
func (w *watchdogLoop) handOff(h *renewal, until time.Time) { w.enlist(h, until, true, false) }

// pend is handOff for a hold handed over ahead of its transfer (see
// handOverAhead), before the transfer is sent: h is not renewed until it
// landed (a renewal must not reach Redis before the field it renews), but
// its lease is watched from now on: a hold whose transfer is still on its
// way when the lease ends is declared lost then, however long the call
// still waits for its reply.
func (w *watchdogLoop) pend(h *renewal, until time.Time) { w.enlist(h, until, true, true) }

// landed lets the watchdog renew h, pended until its transfer landed. A
// hold that a pass passed over while its transfer was on its way is renewed
// at once, beside the passes: the next pass may come after its lease (a
// transfer late by a third of a lease or more). Only the passes on the
// schedule owe such renewals, so that a hot key, whose next holder is
// nearly always pending, costs at most one renewal more per pass.
func (w *watchdogLoop) landed(h *renewal) {
	w.mu.Lock()
	h.pending = false
	owed := h.owed
	h.owed = false
	_, held := w.holds[h]
	w.mu.Unlock()
	if owed && held {
		w.c.goBackground(func() { w.extend([]*renewal{h}) })
	}
}

// claim is how the waiter of a handover looks at h from handOff when its
// goroutine runs: it reports whether h is still renewed with more than
// expiryMargin of its lease left, and otherwise stops renewing it (the lock
// may be someone else's by now). establish then adopts h.
func (w *watchdogLoop) claim(h *renewal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.holds[h]
	if ok && time.Until(h.until) > w.expiryMargin() {
		return true
	}
	delete(w.holds, h)
	return false
}

// adopt ends the handover of h (see handOff) once its owner is held: from
// then on a loss is told to it. It reports whether h is still renewed.
func (w *watchdogLoop) adopt(h *renewal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	h.handed = false
	_, ok := w.holds[h]
	return ok
}

// enlist is add, handOff when handed, and pend when pending too.
func (w *watchdogLoop) enlist(h *renewal, until time.Time, handed, pending bool) {
	w.mu.Lock()
	h.until, h.handed, h.pending, h.owed = until, handed, pending, false
	w.holds[h] = struct{}{}
	if !w.running {
		w.running = w.c.goBackground(w.loop)
	}
	wake := w.idle || w.armed.IsZero() || until.Add(-w.expiryMargin()).Before(w.armed)
	w.mu.Unlock()
	if wake {
		select {
		case w.kick <- struct{}{}:
			w.kicks.Add(1)
		default:
		}
	}
}

// remove stops renewing h. It reports whether h was being renewed. A renewal
// already under way may still reach Redis; the scripts renew only locks
// their owner still holds, so it cannot revive a released lock.
func (w *watchdogLoop) remove(h *renewal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.holds[h]
	delete(w.holds, h)
	return ok
}

// leaseEnd returns when h's lease ends unless renewed.
func (w *watchdogLoop) leaseEnd(h *renewal) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return h.until
}

func (w *watchdogLoop) loop() {
	tick := time.NewTimer(w.period)
	defer tick.Stop()
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	passes := make(chan time.Duration, 1)
	var began time.Time
	for {
		select {
		case <-tick.C:
			// Passes run beside the loop, so that a renewal held up in the
			// network (go-redis waits for its read timeout, not for a lease)
			// cannot keep the loop from declaring a lease over on time.
			began = time.Now()
			if !w.c.goBackground(func() { passes <- w.renew() }) {
				return
			}
		case <-w.kick:
			// A new hold may end before every lease the expiry timer
			// was set for.
			w.armExpiry(expiry)
			w.mu.Lock()
			idle := w.idle
			w.idle = false
			w.mu.Unlock()
			if idle {
				tick.Reset(w.period)
			}
		case retry := <-passes:
			w.armExpiry(expiry)
			if retry < 0 {
				// Nothing was held. A hold added since sent a kick,
				// which may have been taken while the pass ran: look.
				w.mu.Lock()
				idle := len(w.holds) == 0
				w.idle = idle
				w.mu.Unlock()
				if !idle {
					tick.Reset(w.period)
				}
				continue
			}
			// Passes keep their schedule: the next starts a period after
			// this one began, however long this one took, or sooner to
			// retry failures.
			next := began.Add(w.period)
			if r := time.Now().Add(retry); r.Before(next) {
				next = r
			}
			tick.Reset(max(time.Until(next), 0))
		case <-expiry.C:
			w.expireOverdue()
			w.armExpiry(expiry)
		case <-w.c.done:
			return
		}
	}
}

// expiryMargin is how long before a lease ends, unless renewed, its hold is
// declared lost: timers fire late on a busy machine, and the holder must be
// told before Redis lets the next one in.
func (w *watchdogLoop) expiryMargin() time.Duration { return w.c.opts.watchdogTimeout / 20 }

// armExpiry sets t to fire when the earliest lease is about to end unless
// renewed. With nothing held it is set for the earliest a hold of the usual
// lease (the watchdog timeout) taken from now on could need it: such a hold,
// the common case, then finds the timer early enough and need not wake the
// loop (see enlist). Were the timer stopped instead, every Lock after the
// loop had looked at an empty table would wake it again: on an uncontended
// lock, nearly every Lock.
func (w *watchdogLoop) armExpiry(t *time.Timer) {
	w.mu.Lock()
	var earliest time.Time
	for h := range w.holds {
		if earliest.IsZero() || h.until.Before(earliest) {
			earliest = h.until
		}
	}
	if earliest.IsZero() {
		earliest = time.Now().Add(w.c.opts.watchdogTimeout)
	}
	w.armed = earliest.Add(-w.expiryMargin())
	// Reset under mu: an add that reads armed finds the timer set to it.
	t.Reset(max(time.Until(w.armed), 0))
	w.mu.Unlock()
}

// expireOverdue declares lost every hold whose lease has ended (or is about
// to: expiryMargin) without a renewal getting through: it may be held by
// someone else by now, whatever a renewal still under way answers later.
// What Redis may still hold of it (a renewal that arrives late) is released
// in the background.
func (w *watchdogLoop) expireOverdue() {
	now := time.Now().Add(w.expiryMargin())
	var overdue []*renewal
	w.mu.Lock()
	for h := range w.holds {
		if !now.Before(h.until) {
			if !h.handed { // a handed one's waiter finds it gone (claim)
				overdue = append(overdue, h)
			}
			delete(w.holds, h)
		}
	}
	w.mu.Unlock()
	for _, h := range overdue {
		h.fail("its lease ran out before a renewal got through")
		if h.owner != nil {
			// What Redis may still hold of it goes.
			w.c.goBackground(h.owner.abandon)
		}
	}
}

// due reports whether a lock renewed until until needs renewing in a pass
// that runs at now: every lock on a regular pass (renewed about a period
// ago), only those whose last renewal failed on a retry pass.
func (w *watchdogLoop) due(until, now time.Time) bool {
	return until.Sub(now) < w.c.opts.watchdogTimeout-w.period/2
}

// renew extends every hold that is due once and returns how soon to retry
// the ones that failed (a period when none did; <0 when nothing is held:
// wait for the next hold).
func (w *watchdogLoop) renew() time.Duration {
	now := time.Now()
	w.mu.Lock()
	if len(w.holds) == 0 {
		w.mu.Unlock()
		return -1
	}
	all := make([]*renewal, 0, len(w.holds))
	for h := range w.holds {
		if w.due(h.until, now) && !h.pending {
			all = append(all, h)
		} else if h.pending && w.due(h.until, now) {
			h.owed = true // passed over: renewed as it lands (see landed)
		}
	}
	w.mu.Unlock()
	return w.extend(all)
}

// extend renews the holds all once and returns how soon to retry the ones
// that failed (a period when none did).
func (w *watchdogLoop) extend(all []*renewal) time.Duration {
	if len(all) == 0 {
		return w.period
	}

	chunks := w.chunk(all)
	cmds, sent := w.send(chunks)
	now := time.Now()

	next := w.period
	type loss struct {
		h   *renewal
		why string
	}
	var lost []loss
	var renewed []*hold // told to the Observer once w.mu is released
	w.mu.Lock()
	for i, chunk := range chunks {
		vals, err := cmds[i].Int64Slice()
		for j, h := range chunk {
			if _, ok := w.holds[h]; !ok {
				continue // released or lost meanwhile
			}
			switch {
			case err == nil && j < len(vals) && vals[j] == 1:
				h.until = sent[i].Add(w.c.opts.watchdogTimeout)
				if !h.handed { // a handed one's owner is not its waiter's yet
					renewed = append(renewed, h.owner)
				}
			case h.handed && (err == nil || !now.Before(h.until)):
				delete(w.holds, h) // its waiter finds it gone (claim)
			case err == nil:
				lost = append(lost, loss{h, "the watchdog found it gone"})
			case !now.Before(h.until):
				lost = append(lost, loss{h, "renewals failed until its lease ran out: " + err.Error()})
			default:
				retry := max(w.period/8, 10*time.Millisecond)
				next = min(next, retry, h.until.Sub(now))
			}
		}
	}
	w.mu.Unlock()
	for _, h := range renewed {
		if h != nil { // nil: a place in a wait line
			w.c.observe(h, EventRenewed, 0, nil)
		}
	}
	if len(lost) > 0 {
		// A pass over the holds of many requests, no one's: each lost hold
		// is logged with its own context as it is told (renewalLost).
		w.c.opts.logger.DebugContext(context.Background(), "lock: watchdog found locks lost", "count", len(lost))
	}
	for _, l := range lost {
		w.remove(l.h)
		l.h.fail(l.why)
	}
	return max(next, time.Millisecond)
}

// chunk groups holds by script and hash slot and splits the groups into
// script calls of at most renewChunk locks each.
func (w *watchdogLoop) chunk(all []*renewal) [][]*renewal {
	type group struct {
		script *script
		slot   int
	}
	by := make(map[group][]*renewal)
	var order []group
	for _, h := range all {
		g := group{script: h.script}
		if w.c.cluster {
			g.slot = slot(h.keys[0])
		}
		if _, ok := by[g]; !ok {
			order = append(order, g)
		}
		by[g] = append(by[g], h)
	}
	sort.Slice(order, func(i, j int) bool { return order[i].slot < order[j].slot })
	var chunks [][]*renewal
	for _, g := range order {
		hs := by[g]
		for len(hs) > renewChunk {
			chunks = append(chunks, hs[:renewChunk])
			hs = hs[renewChunk:]
		}
		chunks = append(chunks, hs)
	}
	return chunks
}

// send runs each chunk's script once, pipelined renewCallsPerRoundTrip calls
// at a time, and returns the replies and when each call was sent. Each round
// trip has its own deadline, so that a slow one fails alone instead of
// taking the rest of the pass with it. A server that lost its script cache
// gets the script loaded once and the failed calls again.
func (w *watchdogLoop) send(chunks [][]*renewal) ([]*redis.Cmd, []time.Time) {
	lease := w.c.leaseMS
	calls := make([]scriptCall, len(chunks))
	for i, chunk := range chunks {
		var keys []string
		args := []any{lease}
		for _, h := range chunk {
			keys = append(keys, h.keys...)
			args = append(args, h.args...)
		}
		calls[i] = scriptCall{chunk[0].script, keys, args}
	}
	roundTrip := max(w.period, time.Second)
	return w.c.pipelined(calls, renewCallsPerRoundTrip, func() (context.Context, context.CancelFunc) {
		return w.c.backgroundContext(roundTrip)
	})
}
