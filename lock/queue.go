package lock

import (
	"time"
)

// A waitQueue lines up the goroutines of one Client that wait for one lock,
// in arrival order. Only its head tries to acquire; an unlock message wakes
// the head alone, so a release costs one attempt per Client rather than one
// per waiting goroutine, and a goroutine that just unlocked cannot overtake
// the ones already waiting.
type waitQueue struct {
	name    string // its key in Client.queues: the channel, and the lane if any (see laned)
	channel string
	waiters []*waiter
	sub     *chanSub // the unlock channel's subscription, taken by the first head that needs it

	handoffs int       // locks handed from holder to head in a row, without freeing (see cohortLimit)
	yield    time.Time // until then the head lets other Clients take the lock (see yieldDelay, turnStagger)
	others   int64     // other subscribers of the channel when this Client's last turn ended
	heard    int64     // unlock messages that ended other Clients' turns since then
	asked    time.Time // when others was counted (see othersListening)

	line lineWake // a FairMutex waiter's queue only: see lineWake
}

// A lineWake lets the first waiter in a FairMutex's line, whose queue here
// is its own channel's, be woken by the unlock messages of a Mutex of the
// same name too: a Mutex and a FairMutex of one name exclude each other,
// and a Mutex's release (release.lua) publishes on its own channel only.
// The waiter listens on that channel (relayed to its queue) all along, but
// only the first in line acts on it, or a Mutex's unlock would wake every
// waiter in the line; it is first when its last attempt said so, or when a
// message came on its own channel since (those go to the first in line
// only: see fairlib.lua and fair_leave.lua).
type lineWake struct {
	also   string   // the Mutex's unlock channel; "" for the queues of other kinds
	sub    *chanSub // its subscription, taken by the first turn
	behind bool     // the last attempt found others ahead, and no message on the own channel came since
	own    uint64   // messages heard on the own channel
	plain  uint64   // messages heard on also
}

// A lineMark is what a queue of a FairMutex waiter had heard when an attempt
// was sent (see lineMarkOf).
type lineMark struct{ own, plain uint64 }

// lineMarkOf returns what the queue name has heard so far.
func (c *Client) lineMarkOf(name string) lineMark {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[name]; q != nil {
		return lineMark{q.line.own, q.line.plain}
	}
	return lineMark{}
}

// linePlace records what an attempt of the queue name's waiter, sent when
// the queue had heard m, said of its place: first in line or not. It
// reports whether to try again at once: first, and a message on the Mutex's
// channel came while the attempt was under way (ignored then, the waiter
// being behind; it may have freed the lock after the attempt ran).
func (c *Client) linePlace(name string, first bool, m lineMark) bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queues[name]
	if q == nil {
		return false
	}
	if first {
		q.line.behind = false
		return q.line.plain != m.plain
	}
	// A message on the own channel after the attempt was sent may have
	// made the waiter first since: it counts as first until its next attempt.
	q.line.behind = q.line.own == m.own
	return false
}

// heardOwn records a message on channel, the own channel of a FairMutex
// waiter's queue: the waiter is first in line. The caller holds qmu.
func (c *Client) heardOwn(channel string) {
	if q := c.queues[channel]; q != nil {
		q.line.own++
		q.line.behind = false
	}
}

// A laned kind lines its waiters up in a queue of their own, apart from the
// other waiters of the same channel; every message on the channel wakes the
// head of each lane. Its waiters enlist: a failed attempt takes the owner's
// place in a wait line in Redis, so a waiter tries at once when it becomes
// head, to take that place while the waiter before it holds the lock.
type laned interface {
	kind
	lane() string
}

// writersLane is the lane of an RWMutex's writers (writeKind). They wait on
// the channel of its readers but not behind them: only a queue's head tries,
// and a writer must be in the writers' line in Redis from the moment it
// waits, or the readers that arrive after it (in other Clients) keep it out.
const writersLane = "\x00writers"

// lanes are the suffixes of the queue names of a channel: "" for the kinds
// without a lane.
var lanes = [...]string{"", writersLane}

// A waiter is one goroutine in a waitQueue.
type waiter struct {
	notify chan struct{} // capacity 1: "look at your state again"
	shared bool          // waits for a lock several owners may hold at once
	enlist bool          // its attempts take a place in a wait line in Redis (see laned)

	// Guarded by Client.qmu.
	head   bool
	tryNow bool          // try to acquire without waiting
	bound  time.Duration // when it became head without tryNow: try after at most this long; <0 = unset

	grant // its side of the handovers (see handover.go)
}

// queued reports whether goroutines of this Client wait in the queue name.
// A Client nobody of which waits anywhere, the uncontended case, answers
// without taking qmu: a queue exists only while it has waiters.
func (c *Client) queued(name string) bool {
	if c.nqueue.Load() == 0 {
		return false
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queues[name]
	return q != nil && len(q.waiters) > 0
}

// join appends a waiter to the queue name, woken by the messages on channel.
// A waiter that is head at once tries at once (after subscribing: see
// waitFor).
func (c *Client) join(name, channel string, shared, enlist bool, h *hold) (*waitQueue, *waiter) {
	w := &waiter{notify: make(chan struct{}, 1), shared: shared, enlist: enlist, bound: -1, grant: grant{h: h}}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queues[name]
	if q == nil {
		q = &waitQueue{name: name, channel: channel}
		c.queues[name] = q
		c.nqueue.Store(int32(len(c.queues)))
		c.resumeRun(q)
	}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		w.head, w.tryNow = true, true
	}
	return q, w
}

// leaveQueue removes w from q. If w was head, the next waiter becomes head:
// it tries at once if w gave up (w may have swallowed an unlock message), if
// both share the lock, or if it enlists (its attempt takes its place in line
// in Redis), or else waits for the unlock message of the holder w became, at
// most lease.
func (c *Client) leaveQueue(q *waitQueue, w *waiter, acquired bool, lease time.Duration) {
	c.qmu.Lock()
	var release *chanSub
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
	}
	if w.head && len(q.waiters) > 0 {
		next := q.waiters[0]
		next.head = true
		if acquired && !(w.shared && next.shared) && !next.enlist {
			next.bound = lease
		} else {
			next.tryNow = true
		}
		signal(next)
	}
	var also *chanSub
	if len(q.waiters) == 0 {
		c.keepRun(q)
		delete(c.queues, q.name)
		c.nqueue.Store(int32(len(c.queues)))
		release, q.sub = q.sub, nil
		also, q.line.sub = q.line.sub, nil
	}
	c.qmu.Unlock()
	if release != nil {
		c.subs.release(release)
	}
	if also != nil {
		c.removeRelay(q.line.also, relay{to: c, channel: q.name, line: true})
		c.subs.release(also)
	}
}

// deliver handles a message on an unlock channel: the head of its queue tries
// again, and so do the heads of the queues the channel is relayed to.
// Messages for channels nobody waits on are dropped.
func (c *Client) deliver(channel string) {
	c.qmu.Lock()
	c.heardOwn(channel)
	c.wakeHead(channel)
	var relays []relay
	for r := range c.relays[channel] {
		relays = append(relays, r)
	}
	c.qmu.Unlock()
	for _, r := range relays {
		r.to.qmu.Lock()
		if r.line {
			r.to.wakeLine(r.channel)
		} else {
			r.to.wakeHead(r.channel)
		}
		r.to.qmu.Unlock()
	}
}

// wakeLine handles a Mutex's unlock message for the queue name of a
// FairMutex waiter (see lineWake): its waiter tries again unless it is
// behind others in line. The caller holds qmu.
func (c *Client) wakeLine(name string) {
	q := c.queues[name]
	if q == nil {
		return
	}
	q.line.plain++
	if !q.line.behind {
		c.wakeQueue(q)
	}
}

// wakeHead makes the head of each of channel's queues (see laned) try
// again. The caller holds qmu.
//
// After an unlock message that ended another Client's turn, the head of a
// Client that has had a turn lately lets those that waited longer go first
// (see turnStagger): it tries after a pause of turnStagger for each Client
// that, by the turns it has heard end since its own, is still due before
// it, and then only if a look shows the lock free.
func (c *Client) wakeHead(channel string) {
	for _, lane := range lanes {
		c.wakeQueue(c.queues[channel+lane])
	}
}

// wakeQueue makes the head of q, if any, try again: see wakeHead.
func (c *Client) wakeQueue(q *waitQueue) {
	if q == nil || len(q.waiters) == 0 {
		return
	}
	if now := time.Now(); q.others > 0 && now.After(q.yield) {
		q.heard++
		if due := q.others - q.heard; due > 0 {
			q.yield = now.Add(time.Duration(due)*turnStagger + c.foreignFirst(q.channel, now))
		} else {
			q.yield = time.Time{} // its turn: try at once, without a look first
		}
	}
	h := q.waiters[0]
	h.tryNow = true
	signal(h)
}

// learnLease handles the message that the lock the head of channel's queue
// waits for was just taken with a lease of d (see leaseMessage): unless it
// is about to try anyway, the head waits for the unlock message at most d
// from now, instead of the bound its last attempt gave it.
func (c *Client) learnLease(channel string, d time.Duration) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	c.heardOwn(channel)
	q := c.queues[channel]
	if q == nil || len(q.waiters) == 0 {
		return
	}
	if h := q.waiters[0]; !h.tryNow {
		h.bound = d
		signal(h)
	}
}

// A relay forwards the unlock messages of one of this Client's channels to
// the queue of a channel of another Client: a RedLock waits in the queue of
// its first node and is woken by an unlock on any node.
type relay struct {
	to      *Client
	channel string
	line    bool // to a FairMutex waiter's queue, from its Mutex's channel: see lineWake
}

// addRelay forwards the messages of channel to r until removeRelay.
func (c *Client) addRelay(channel string, r relay) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.relays[channel] == nil {
		c.relays[channel] = make(map[relay]int)
	}
	c.relays[channel][r]++
}

// removeRelay undoes one addRelay.
func (c *Client) removeRelay(channel string, r relay) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if m := c.relays[channel]; m != nil {
		if m[r]--; m[r] <= 0 {
			delete(m, r)
		}
		if len(m) == 0 {
			delete(c.relays, channel)
		}
	}
}

// signal wakes w without blocking; a pending wake-up is enough.
func signal(w *waiter) {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}
