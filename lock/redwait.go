package lock

import (
	"context"
	"time"
)

// A redWait is the subscription side of one RedLock wait: the waiter waits
// in the queue of its home node's Client, and an unlock on any node wakes
// it.
type redWait struct {
	r       *RedLock
	home    int        // the client index whose queue the wait is in
	subs    []*chanSub // by client index; [home] unused (the queue's own)
	relayed []bool
}

// subscribe subscribes the unlock channel on every node it can reach within
// a node timeout. A node that cannot be reached is skipped: its unlock
// messages are missed, which the wait's bound covers.
func (w *redWait) subscribe(ctx context.Context, q *waitQueue, deadline <-chan time.Time) error {
	r := w.r
	c0 := r.clients[w.home]
	if w.subs == nil {
		w.subs = make([]*chanSub, len(r.clients))
		w.relayed = make([]bool, len(r.clients))
	}
	all := []*chanSub{c0.queueSub(q)}
	for i, c := range r.clients {
		if i == w.home {
			continue
		}
		if w.subs[i] == nil {
			w.subs[i] = c.subs.acquire(r.nodes[i].unlockCh)
		}
		if !w.relayed[i] {
			c.addRelay(r.nodes[i].unlockCh, relay{to: c0.lines, channel: q.channel})
			w.relayed[i] = true
		}
		all = append(all, w.subs[i])
	}
	_, timeout, _ := r.timing(lockOptions{})
	timer := time.NewTimer(timeout)
	defer timer.Stop()
wait:
	for _, s := range all {
		select {
		case <-s.ready:
		case <-timer.C:
			break wait
		case <-deadline:
			return notAcquired(ctx, r.name)
		case <-ctx.Done():
			return ctxErr(r.name, ctx)
		}
	}
	// Drop failed subscriptions, so that the next attempt subscribes anew.
	if drop := c0.dropFailedSub(q); drop != nil {
		c0.subs.release(drop)
	}
	for i := range r.clients {
		if s := w.subs[i]; i != w.home && isDone(s.ready) && s.err != nil {
			r.clients[i].subs.release(s)
			w.subs[i] = nil
		}
	}
	return nil
}

// close ends the subscriptions and relays of the wait.
func (w *redWait) close() {
	home := relay{to: w.r.clients[w.home].lines, channel: w.r.nodes[w.home].unlockCh}
	for i := range w.subs {
		if i == w.home {
			continue
		}
		c := w.r.clients[i]
		if w.subs[i] != nil {
			c.subs.release(w.subs[i])
		}
		if w.relayed[i] {
			c.removeRelay(w.r.nodes[i].unlockCh, home)
		}
	}
}
