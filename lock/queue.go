package lock

// The waiting lines at work: joining and leaving a queue, the wake-ups an
// unlock message brings, the relays between Clients, and the subscriptions
// of a queue's channels. Every method here belongs to lines and takes its
// qmu (a waiter's own state and the handover to it: waiter.go).

import (
	"context"
	"time"
)

// lineMarkOf returns what the queue name has heard so far.
func (c *lines) lineMarkOf(name string) lineMark {
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
func (c *lines) linePlace(name string, first bool, m lineMark) bool {
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
func (c *lines) heardOwn(channel string) {
	if q := c.queues[channel]; q != nil {
		q.line.own++
		q.line.behind = false
	}
}

// queued reports whether goroutines of this Client wait in the queue name.
// A Client nobody of which waits anywhere, the uncontended case, answers
// without taking qmu: a queue exists only while it has waiters.
func (c *lines) queued(name string) bool {
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
func (c *lines) join(name, channel string, shared, enlist bool, h *hold) (*waitQueue, *waiter) {
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
func (c *lines) leaveQueue(q *waitQueue, w *waiter, acquired bool, lease time.Duration) {
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
func (c *lines) deliver(channel string) {
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
func (c *lines) wakeLine(name string) {
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
func (c *lines) wakeHead(channel string) {
	for _, lane := range lanes {
		c.wakeQueue(c.queues[channel+lane])
	}
}

// wakeQueue makes the head of q, if any, try again: see wakeHead.
func (c *lines) wakeQueue(q *waitQueue) {
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
func (c *lines) learnLease(channel string, d time.Duration) {
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

// addRelay forwards the messages of channel to r until removeRelay.
func (c *lines) addRelay(channel string, r relay) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.relays[channel] == nil {
		c.relays[channel] = make(map[relay]int)
	}
	c.relays[channel][r]++
}

// removeRelay undoes one addRelay.
func (c *lines) removeRelay(channel string, r relay) {
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

// resubscribe drops the subscription cs of channel's queues (see laned)
// that still use it, and wakes their head waiters, which subscribe anew when
// they have to wait.
func (c *lines) resubscribe(channel string, cs *chanSub) {
	c.qmu.Lock()
	drops := 0
	for _, lane := range lanes {
		q := c.queues[channel+lane]
		if q == nil || q.sub != cs {
			continue
		}
		q.sub = nil
		drops++
		if len(q.waiters) > 0 {
			h := q.waiters[0]
			h.tryNow = true
			signal(h)
		}
	}
	c.qmu.Unlock()
	for ; drops > 0; drops-- {
		c.subs.release(cs)
	}
}

// alsoWokenBy makes the waiter of q, a FairMutex waiter's queue, be woken
// by the messages of the channel also too (see lineWake).
func (c *lines) alsoWokenBy(q *waitQueue, also string) {
	c.qmu.Lock()
	q.line.also = also
	c.qmu.Unlock()
}

// queueSub returns the subscription of q's unlock channel, taking it first
// if q has none (a RedLock's wait: see redWait.subscribe).
func (c *lines) queueSub(q *waitQueue) *chanSub {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q.sub == nil {
		q.sub = c.subs.acquire(q.channel)
	}
	return q.sub
}

// dropFailedSub takes the subscription of q's unlock channel from q when it
// failed, so that the next head subscribes anew, and returns it for the
// caller to release; nil when there is none to drop.
func (c *lines) dropFailedSub(q *waitQueue) *chanSub {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if s := q.sub; s != nil && isDone(s.ready) && s.err != nil {
		q.sub = nil
		return s
	}
	return nil
}

// awaitSubscription makes sure q's unlock channel is subscribed and confirmed,
// and the channel its waiter is also woken by if any (see lineWake).
// A subscription that failed is dropped, so that the next head subscribes anew.
func (c *lines) awaitSubscription(ctx context.Context, q *waitQueue, deadline <-chan time.Time) error {
	if err := c.awaitChannel(ctx, q, &q.sub, q.channel, deadline); err != nil || q.line.also == "" {
		return err
	}
	return c.awaitChannel(ctx, q, &q.line.sub, q.line.also, deadline)
}

// awaitChannel makes sure channel is subscribed and confirmed for q, its
// subscription kept in *sub (guarded by qmu). The subscription of a
// lineWake's channel is relayed to q.
func (c *lines) awaitChannel(ctx context.Context, q *waitQueue, slot **chanSub, channel string, deadline <-chan time.Time) error {
	c.qmu.Lock()
	relayed := false
	if *slot == nil {
		*slot = c.subs.acquire(channel)
		relayed = slot == &q.line.sub
	}
	sub := *slot
	c.qmu.Unlock()
	if relayed {
		c.addRelay(channel, relay{to: c, channel: q.name, line: true})
	}
	select {
	case <-sub.ready:
	case <-deadline:
		return ErrNotAcquired
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return ErrClosed
	}
	err := sub.err
	if err == nil {
		return nil
	}
	c.qmu.Lock()
	drop := *slot == sub
	if drop {
		*slot = nil
	}
	c.qmu.Unlock()
	if drop {
		if slot == &q.line.sub {
			c.removeRelay(channel, relay{to: c, channel: q.name, line: true})
		}
		c.subs.release(sub)
	}
	return noted("subscribe to unlock messages", unavailable(err))
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
