package lock

import (
	"context"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
)

// Handovers: a releasing holder gives the lock straight to the next waiter
// of its Client (transfer.lua), without freeing it, in turns bounded by
// cohortLimit so that the other Clients get the lock too.

// A grant is a waiter's side of the handovers (see cohortLimit). h is the
// hold the waiter acquires, nil for the locks of several keys (MultiLock,
// RedLock); only holds whose kind can hand over (handing) are ever handed
// the lock. A releaser reads only the fields of h that do not change while
// it waits, and sets up h's renewal at a handover (see handOff). Guarded by
// Client.qmu.
type grant struct {
	h        *hold
	reserved bool          // a releaser is handing the lock over to this waiter
	trying   bool          // the waiter is trying to acquire by itself: no handover to it meanwhile
	granted  bool          // the lock was handed over: it is held for h
	grantTok fencing.Token // the token the handover gave h
	grantTop fencing.Token // the last token reserved for h's run of handovers (see tokenBlock)
	grantAt  time.Time     // when h's lease began: the handover was sent, or the releaser's lease began
	leaving  bool          // the waiter gave up: no handover any more
}

// A handing kind can hand its lock from a holder straight to a waiter of the
// same Client (see cohortLimit).
type handing interface {
	kind
	// transfer hands the lock from from, at its final release, to to,
	// setting a new lease when lease > 0 and keeping the lock's expiry
	// otherwise. It returns to's token and the last token reserved for
	// to's run of handovers, or a negative token when from does not hold
	// the lock any more.
	transfer(ctx context.Context, from, to *hold, lease time.Duration) (tok, top fencing.Token, err error)
	// abort frees the lock after a transfer from from to to whose outcome
	// is unknown, whichever of the two holds it, in one call: the transfer
	// may still be on its way, and finding from's field gone it then
	// changes nothing.
	abort(ctx context.Context, from, to *hold) error
	// probe reports whether h's lock is free, with one command, and if not,
	// how long to wait for an unlock message at most.
	probe(ctx context.Context, h *hold) (bool, time.Duration, error)
}

// handOver releases h's last level by handing the lock to waiter w. until,
// when set, is when h's lease ends unless the watchdog renews it: a waiter
// the watchdog renews too keeps that lease when enough of it is left,
// rather than have the handover set it anew.
func (c *Client) handOver(ctx context.Context, h *hold, w *waiter, until time.Time, renewed bool) error {
	at := time.Now()
	lease := w.h.lease
	if !until.IsZero() && !w.h.fixed && w.h.lease == h.lease && until.Sub(at) > lease/2 {
		at, lease = until.Add(-lease), 0
	}
	tok, top, err := h.kind.(handing).transfer(context.WithoutCancel(ctx), h, w.h, lease)
	switch {
	case err != nil:
		if outcomeUnknown(err) {
			// Maybe handed over, maybe still on its way: free the lock,
			// rather than leave it held for a waiter that does not know,
			// and remove h's field with it, so that a transfer arriving
			// later finds nothing to hand over.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			aerr := h.kind.(handing).abort(rctx, h, w.h)
			cancel()
			if aerr == nil {
				c.handedOver(w, false, at, 0, 0)
				return c.settle(h, renewed, 0, nil)
			}
		}
		c.handedOver(w, false, at, 0, 0)
		return c.settle(h, renewed, 0, err)
	case tok < 0:
		c.handedOver(w, false, at, 0, 0)
		return c.settle(h, renewed, -1, nil)
	}
	if !w.h.fixed {
		// Renewed from now on, not from when w's goroutine runs: on a
		// loaded machine that can be after the lease.
		if w.h.renewal.script == nil {
			w.h.renewal.script, w.h.renewal.keys, w.h.renewal.args = w.h.kind.renewal(w.h)
		}
		c.dog.handOff(&w.h.renewal, at.Add(w.h.lease))
	}
	c.handedOver(w, true, at, tok, top)
	c.observe(h, EventHandedOver, 0, nil)
	err = c.settle(h, renewed, 0, nil)
	// The new holder runs first, as sync.Mutex hands over when starving:
	// on a hot key the handovers are the critical path, and whatever the
	// releaser does next (answer its request, take the next one) would
	// otherwise keep its P, and the new holder waiting, until it blocks.
	runtime.Gosched()
	return err
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

// yieldDelay is how long the head of a Client that has just ended a run of
// handovers (see cohortLimit) lets the waiters of other Clients take the
// lock before it tries itself. It is woken then even if the unlock message
// escaped it.
const yieldDelay = time.Millisecond

// reserveHandover picks the waiter of this Client that h's lock can be handed
// to at its final release: the head of its queue, waiting for the same lock
// through a kind that can hand over. The caller then completes the handover
// with handedOver. After cohortLimit handovers in a row there is none, and
// turn reports that the Client's turn is over: the caller frees the lock
// and calls endTurn.
func (c *Client) reserveHandover(h *hold) (w *waiter, turn bool) {
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

// renewTurn starts a new run of handovers on channel without freeing the
// lock: no other Client waits for its turn.
func (c *Client) renewTurn(channel string) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[channel]; q != nil {
		q.handoffs = 0
	}
}

// othersListening returns how many subscribers other than this Client
// listen on channel — other Clients, or Redisson clients, whose waiters
// deserve a turn. It asks Redis at most once per turn (PUBSUB NUMSUB, or
// SHARDNUMSUB on the channel's node in a Cluster), and answers -1 (some,
// how many unknown) when Redis cannot say.
//
// A count above zero is taken as still true for othersFresh: other Clients
// that waited for a turn a moment ago most likely still do, and asking
// would keep the lock held for one more round trip at the end of every turn.
func (c *Client) othersListening(ctx context.Context, channel string) int64 {
	c.qmu.Lock()
	if q := c.queues[channel]; q != nil && q.others > 0 && time.Since(q.asked) < othersFresh {
		c.qmu.Unlock()
		return q.others
	}
	c.qmu.Unlock()
	asked := time.Now()
	n := c.countOthers(ctx, channel)
	c.qmu.Lock()
	if q := c.queues[channel]; q != nil && n > 0 {
		q.asked = asked
	}
	c.qmu.Unlock()
	return n
}

// othersFresh is how long othersListening trusts a count above zero.
const othersFresh = 100 * time.Millisecond

// countOthers asks Redis for othersListening.
func (c *Client) countOthers(ctx context.Context, channel string) int64 {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var counts map[string]int64
	var err error
	if c.cluster {
		var node *redis.Client
		if node, err = c.rdb.(*redis.ClusterClient).MasterForKey(ctx, channel); err == nil {
			counts, err = node.PubSubShardNumSub(ctx, channel).Result()
		}
	} else {
		counts, err = c.rdb.PubSubNumSub(ctx, channel).Result()
	}
	if err != nil {
		return -1
	}
	return max(counts[channel]-c.subs.listening(channel), 0)
}

// startTurn is called before the lock of channel is freed at the end of
// this Client's turn, when others other subscribers listen (-1: some): from
// then on its head holds back (its own unlock message must not send it
// racing the others).
func (c *Client) startTurn(channel string, others int64) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[channel]; q != nil {
		q.yield = time.Now().Add(yieldDelay)
		q.heard, q.others = 0, others
	}
}

// endTurn is called after the lock of channel was freed at the end of this
// Client's turn: its head lets the other Clients try first, for yieldDelay,
// and then looks whether the lock is free even if it heard no unlock
// message.
func (c *Client) endTurn(channel string) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[channel]; q != nil {
		q.handoffs = 0
		q.yield = time.Now().Add(yieldDelay)
		if len(q.waiters) > 0 {
			h := q.waiters[0]
			h.tryNow = true
			signal(h)
		}
	}
}

// handedOver completes a handover to w reserved by reserveHandover: when it
// succeeded (at: when w's lease began; tok and top: the token it gave w and
// the last one reserved) w is woken holding the lock; otherwise w tries to
// acquire at once.
func (c *Client) handedOver(w *waiter, ok bool, at time.Time, tok, top fencing.Token) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	w.reserved = false
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
func (c *Client) withdraw(w *waiter) (time.Time, fencing.Token, fencing.Token, bool) {
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
