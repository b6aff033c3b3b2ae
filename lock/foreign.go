package lock

// Foreign waiters: clients of a lock's channel that are not Clients of this
// package (Redisson's, on a name shared with Java services). They are woken
// by the unlock message like another Client's head, but need longer to take
// the lock (the message, their own scheduling, then one round trip), and
// they do not take part in the turns of turnStagger: left to the races, a
// Client's next attempt (a fresh Lock, or its head after yieldDelay) takes
// the lock first nearly every time, and a foreign waiter waits for seconds.
//
// So every subscription of a Client to an unlock channel comes with one to
// the channel's mark (markChannel), which nobody publishes on: PUBSUB NUMSUB
// of both, in the one command that counts the others at the end of a turn
// (countOthers), tells the foreign subscribers from the Clients of this
// package. While foreign ones listen, a Client that frees the lock (at the
// end of a turn, or with no waiter of its own) holds its waiters and its
// fresh Lock calls on that channel back for foreignYield, and the run of
// handovers that ends a turn is counted across the moments its queue is
// empty (the waiters of a Client with few goroutines come and go between
// handovers), so that the turns do end.

import (
	"time"
)

// foreignYield is how long a Client that freed a lock while foreign waiters
// listen lets them take it before its own head looks, and before its fresh
// Lock calls try: long enough for a woken Redisson waiter on a loaded host.
// It is spent only when the foreign waiter does not take the lock; when it
// does, its unlock message ends the wait. The real Redisson client on a
// loaded 2-core host took the lock 1.5 ms after the free at the median and
// 4-5 ms at the 90th percentile; at 5 ms it missed about one turn's end in
// seven, and its threads' longest waits were near 500 ms.
const foreignYield = 10 * time.Millisecond

// foreignFresh is how long a count of foreign waiters is trusted by a free
// outside a turn's end, where nothing counts them again.
const foreignFresh = time.Second

// runSweep is how many foreignRun records a Client keeps before it drops
// the stale ones (see runOf).
const runSweep = 64

// runOf returns channel's foreignRun, creating it. The caller holds qmu.
//
// A record is dropped by the next free or queue of its channel once it has
// nothing left to say; one that none comes for (a hold lost rather than
// released, a name no longer used) goes when runSweep records have piled
// up, so that a Client that met foreign waiters once does not look records
// up for every Lock and Unlock from then on.
func (c *lines) runOf(channel string) *foreignRun {
	r := c.runs[channel]
	if r == nil {
		if len(c.runs) >= runSweep {
			now := time.Now()
			for ch, old := range c.runs {
				if now.Sub(old.asked) > foreignFresh && now.After(old.back) {
					delete(c.runs, ch) // a run of handovers it kept is long over, or lost
				}
			}
		}
		r = &foreignRun{}
		c.runs[channel] = r
		c.nruns.Store(int32(len(c.runs)))
	}
	return r
}

// dropRun forgets channel's foreignRun when it has nothing left to say. The
// caller holds qmu.
func (c *lines) dropRun(channel string, r *foreignRun, now time.Time) {
	if r.handoffs == 0 && r.given == 0 && now.After(r.back) && (r.foreign == 0 || now.Sub(r.asked) > foreignFresh) {
		delete(c.runs, channel)
		c.nruns.Store(int32(len(c.runs)))
	}
}

// countedForeign records a count of channel's foreign subscribers.
func (c *lines) countedForeign(channel string, n int64, at time.Time) {
	if n <= 0 && c.nruns.Load() == 0 {
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if n <= 0 {
		if r := c.runs[channel]; r != nil {
			r.foreign = 0
			c.dropRun(channel, r, at)
		}
		return
	}
	r := c.runOf(channel)
	r.foreign, r.asked = n, at
}

// permitTurn is how many Semaphore permits a Client gives back on a channel
// where foreign waiters listen for each one it lets them take first. A
// permit given back is announced on the channel, but a Redisson waiter
// needs the message, its wake-up and a round trip to take it, while this
// Client's next acquisition needs one round trip; and once a Redisson
// client has a permit, its threads keep it in turn the same way. Measured
// with the real Redisson client, two Java threads beside two goroutines of
// one Client on 2 permits, holds of 0.5-3.5 ms, shares of the holds of each
// Java thread: 7-10% without turns; 41% when every release let them go
// first, 37% at one release in 2, 34% in 3, 33% in 4, 25% in 8.
const permitTurn = 8

// permitGiven records that this Client gave a Semaphore permit back on
// channel with n foreign subscribers listening: at every permitTurn-th such
// release the foreign waiters are let go first (see freed), as at the end of
// a Mutex's turn.
func (c *lines) permitGiven(channel string, n int64, at time.Time) {
	if n <= 0 {
		if c.nruns.Load() > 0 {
			c.qmu.Lock()
			if r := c.runs[channel]; r != nil {
				r.given, r.foreign = 0, 0
				c.dropRun(channel, r, at)
			}
			c.qmu.Unlock()
		}
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	r := c.runOf(channel)
	r.given++
	r.foreign, r.asked = 0, at
	if r.given%permitTurn == 0 {
		r.foreign = n
	}
}

// yieldFor returns how long the head of channel's queue lets others take
// the lock freed at the end of this Client's turn, and sets the hold-back
// of the Client's fresh Lock calls when foreign waiters listen. The caller
// holds qmu.
func (c *lines) yieldFor(channel string, now time.Time) time.Duration {
	r := c.runs[channel]
	if r == nil || r.foreign <= 0 || now.Sub(r.asked) > foreignFresh {
		return yieldDelay
	}
	r.back = now.Add(foreignYield)
	return foreignYield
}

// foreignFirst returns how much longer the head of channel's queue, still
// due behind others after an unlock message, lets foreign waiters take the
// lock first: foreignYield while some listen, so that another Client of
// this package's turn ending gives them their chance too, else nothing.
// The caller holds qmu.
func (c *lines) foreignFirst(channel string, now time.Time) time.Duration {
	if r := c.runs[channel]; r != nil && r.foreign > 0 && now.Sub(r.asked) <= foreignFresh {
		return foreignYield
	}
	return 0
}

// keepRun records, as the queue q empties, its run of handovers for the
// next queue of its channel: the last waiter may hold the lock by a
// handover, and the goroutine that handed it over comes back at once. The
// caller holds qmu.
func (c *lines) keepRun(q *waitQueue) {
	if q.handoffs > 0 && q.line.also == "" && q.name == q.channel {
		c.runOf(q.channel).handoffs = q.handoffs
	}
}

// resumeRun gives a new queue of channel the run of handovers its last one
// left, and, when foreign waiters were let go first a moment ago, the
// hold-back. The caller holds qmu.
func (c *lines) resumeRun(q *waitQueue) {
	r := c.runs[q.channel]
	if r == nil || q.name != q.channel {
		return
	}
	now := time.Now()
	q.handoffs, r.handoffs = r.handoffs, 0
	if now.Before(r.back) {
		q.yield = r.back
	}
	c.dropRun(q.channel, r, now)
}

// heldBack reports whether a fresh Lock call on channel lets foreign
// waiters go first (see foreignRun.back): it queues instead of trying.
func (c *lines) heldBack(channel string) bool {
	if c.nruns.Load() == 0 {
		return false
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	r := c.runs[channel]
	return r != nil && time.Now().Before(r.back)
}

// freed is called after this Client freed the lock of channel other than
// at the end of a turn: the run of handovers is over, and when foreign
// waiters listen, the Client's head and fresh Lock calls let them go first.
func (c *lines) freed(channel string) {
	if c.nruns.Load() == 0 {
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	r := c.runs[channel]
	if r == nil {
		return
	}
	now := time.Now()
	r.handoffs = 0
	if r.foreign > 0 && now.Sub(r.asked) <= foreignFresh {
		r.back = now.Add(foreignYield)
		if q := c.queues[channel]; q != nil {
			q.handoffs = 0
			q.yield = r.back
		}
	}
	c.dropRun(channel, r, now)
}
