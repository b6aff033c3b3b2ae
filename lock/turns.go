package lock

// Turns between Clients: a Client hands a hot lock to its own waiters for
// at most cohortLimit handovers in a row, then, when other clients listen
// on the lock's channel, frees it and lets their waiters try first.

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewTurn starts a new run of handovers on channel without freeing the
// lock: no other Client waits for its turn.
func (c *lines) renewTurn(channel string) {
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
func (c *lines) othersListening(ctx context.Context, channel string) int64 {
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

// countOthers asks Redis for othersListening, and records how many of the
// others are foreign (see markChannel) with countedForeign.
func (c *lines) countOthers(ctx context.Context, channel string) int64 {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	at := time.Now()
	chans := []string{channel}
	mark := markChannel(channel, c.cluster)
	if mark != "" {
		chans = append(chans, mark)
	}
	var counts map[string]int64
	var err error
	if c.cluster {
		var node *redis.Client
		if node, err = c.rdb.(*redis.ClusterClient).MasterForKey(ctx, channel); err == nil {
			counts, err = node.PubSubShardNumSub(ctx, chans...).Result()
		}
	} else {
		counts, err = c.rdb.PubSubNumSub(ctx, chans...).Result()
	}
	if err != nil {
		return -1
	}
	if mark != "" {
		c.countedForeign(channel, counts[channel]-counts[mark], at)
	}
	return max(counts[channel]-c.subs.listening(channel), 0)
}

// startTurn is called before the lock of channel is freed at the end of
// this Client's turn, when others other subscribers listen (-1: some): from
// then on its head holds back (its own unlock message must not send it
// racing the others).
func (c *lines) startTurn(channel string, others int64) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[channel]; q != nil {
		now := time.Now()
		q.yield = now.Add(c.yieldFor(channel, now))
		q.heard, q.others = 0, others
	}
}

// endTurn is called after the lock of channel was freed at the end of this
// Client's turn: its head lets the other Clients try first, for yieldDelay,
// and then looks whether the lock is free even if it heard no unlock
// message.
func (c *lines) endTurn(channel string) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if q := c.queues[channel]; q != nil {
		q.handoffs = 0
		now := time.Now()
		q.yield = now.Add(c.yieldFor(channel, now))
		if len(q.waiters) > 0 {
			h := q.waiters[0]
			h.tryNow = true
			signal(h)
		}
	}
}
