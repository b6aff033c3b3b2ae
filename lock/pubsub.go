package lock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscriptionLinger is how long an unlock channel stays subscribed after its
// last waiter left, so that a hot lock does not subscribe and unsubscribe
// around every handoff.
const subscriptionLinger = 2 * time.Second

// A subscriber owns the Client's pub/sub connections: one for a single node
// or Sentinel deployment, one per master node in a Cluster (shard channels
// live on the node that owns their slot). Each unlock channel is subscribed
// once, however many goroutines wait on it; one goroutine per connection
// reads the messages and wakes the head of the matching wait queue.
type subscriber struct {
	c  *link
	to wakeups // the waiting lines

	mu      sync.Mutex
	conns   map[string]*psConn // by node address; "" when not Cluster
	chans   map[string]*chanSub
	closing map[string]chan struct{} // channels whose UNSUBSCRIBE is being sent; closed once it is
	closed  bool
}

// A psConn is one pub/sub connection and the goroutine reading it.
type psConn struct {
	ps      *redis.PubSub
	sharded bool   // SSUBSCRIBE / SUNSUBSCRIBE (Cluster)
	addr    string // the node's address in a Cluster: its key in subscriber.conns
}

// A chanSub is the subscription of one unlock channel.
type chanSub struct {
	channel string
	conn    *psConn
	ready   chan struct{} // closed when confirmed by the server, or failed
	err     error         // why it failed; written before ready is closed

	// Guarded by subscriber.mu.
	refs      int
	confirmed bool
	idle      *time.Timer // pending unsubscribe
}

// A wakeups takes what a subscriber hears: the waiting lines (lines).
type wakeups interface {
	// deliver handles an unlock message on channel.
	deliver(channel string)
	// learnLease handles the message that the lock of channel was just
	// taken with a lease of d (see leaseMessage).
	learnLease(channel string, d time.Duration)
	// resubscribe drops cs, a subscription of channel that failed or
	// moved, from the queues that still use it and wakes their heads.
	resubscribe(channel string, cs *chanSub)
}

// newSubscriber returns the subscriber of the Client behind c, which hands
// what it hears to to.
func newSubscriber(c *link, to wakeups) *subscriber {
	return &subscriber{c: c, to: to, conns: make(map[string]*psConn), chans: make(map[string]*chanSub), closing: make(map[string]chan struct{})}
}

// acquire returns the subscription of channel, counting the caller as a user
// until release. A new subscription is requested in the background; wait on
// its ready channel.
func (s *subscriber) acquire(channel string) *chanSub {
	s.mu.Lock()
	if cs := s.chans[channel]; cs != nil {
		cs.refs++
		if cs.idle != nil {
			cs.idle.Stop()
			cs.idle = nil
		}
		s.mu.Unlock()
		return cs
	}
	cs := &chanSub{channel: channel, refs: 1, ready: make(chan struct{})}
	if s.closed {
		s.mu.Unlock()
		cs.err = ErrClosed
		close(cs.ready)
		return cs
	}
	s.chans[channel] = cs
	after := s.closing[channel]
	s.mu.Unlock()
	s.c.goBackground(func() { s.subscribe(cs, after) })
	return cs
}

// subscribe sends the SUBSCRIBE (SSUBSCRIBE) for cs, once the UNSUBSCRIBE of
// an earlier subscription of the channel has gone out (after is closed then;
// nil when there is none): the server applies them in order, so the new
// subscription is never undone by the old one. The reading goroutine
// confirms it when the server answers.
func (s *subscriber) subscribe(cs *chanSub, after chan struct{}) {
	ctx, cancel := s.c.backgroundContext(10 * time.Second)
	defer cancel()
	if after != nil {
		select {
		case <-after:
		case <-ctx.Done():
			s.fail(cs, ctx.Err())
			return
		}
	}
	pc, err := s.connFor(ctx, cs.channel)
	if err == nil {
		s.mu.Lock()
		cs.conn = pc
		s.mu.Unlock()
		chans := s.withMark(cs.channel)
		if pc.sharded {
			err = pc.ps.SSubscribe(ctx, chans...)
		} else {
			err = pc.ps.Subscribe(ctx, chans...)
		}
	}
	if err != nil {
		s.fail(cs, err)
	}
}

// withMark returns channel and its mark (see markChannel), subscribed and
// unsubscribed together.
func (s *subscriber) withMark(channel string) []string {
	if mark := markChannel(channel, s.c.cluster); mark != "" {
		return []string{channel, mark}
	}
	return []string{channel}
}

// fail ends cs with err: its waiters see the error, the next one subscribes anew.
func (s *subscriber) fail(cs *chanSub, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chans[cs.channel] == cs {
		delete(s.chans, cs.channel)
	}
	if !cs.confirmed {
		cs.confirmed = true
		cs.err = err
		close(cs.ready)
	}
}

// release ends one use of cs. The channel is unsubscribed when it has had no
// user for subscriptionLinger.
func (s *subscriber) release(cs *chanSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs.refs--
	if cs.refs > 0 || s.chans[cs.channel] != cs || s.closed {
		return
	}
	cs.idle = time.AfterFunc(subscriptionLinger, func() {
		s.mu.Lock()
		if cs.refs > 0 || s.chans[cs.channel] != cs || s.closed {
			s.mu.Unlock()
			return
		}
		delete(s.chans, cs.channel)
		conn := cs.conn
		if conn == nil { // its SUBSCRIBE has not gone out either
			s.mu.Unlock()
			return
		}
		done := make(chan struct{})
		s.closing[cs.channel] = done
		s.mu.Unlock()
		ctx, cancel := s.c.backgroundContext(5 * time.Second)
		if chans := s.withMark(cs.channel); conn.sharded {
			_ = conn.ps.SUnsubscribe(ctx, chans...)
		} else {
			_ = conn.ps.Unsubscribe(ctx, chans...)
		}
		cancel()
		s.mu.Lock()
		if s.closing[cs.channel] == done {
			delete(s.closing, cs.channel)
		}
		s.mu.Unlock()
		close(done)
	})
}

// connFor returns the pub/sub connection that carries channel, creating it and
// its reading goroutine on first use.
func (s *subscriber) connFor(ctx context.Context, channel string) (*psConn, error) {
	addr := ""
	var node *redis.Client
	if s.c.cluster {
		n, err := s.c.rdb.(*redis.ClusterClient).MasterForKey(ctx, channel)
		if err != nil {
			return nil, fmt.Errorf("find the node of %s: %w", channel, err)
		}
		node, addr = n, n.Options().Addr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if pc := s.conns[addr]; pc != nil {
		return pc, nil
	}
	pc := &psConn{sharded: node != nil, addr: addr}
	if node != nil {
		pc.ps = node.SSubscribe(ctx)
	} else {
		pc.ps = s.c.rdb.Subscribe(ctx)
	}
	s.conns[addr] = pc
	s.c.goBackground(func() { s.read(pc) })
	return pc, nil
}

// read receives the messages of pc until the Client closes. When the
// connection breaks, go-redis reconnects and subscribes again on the next
// receive; unlock messages published meanwhile are lost, so every
// re-confirmed channel wakes its head waiter to try again.
//
// Its log records concern the connection, which serves the waiters of many
// requests and belongs to none: they are written with context.Background().
func (s *subscriber) read(pc *psConn) {
	backoff := time.Duration(0)
	broken := false
	for {
		msg, err := pc.ps.Receive(context.Background())
		if err != nil {
			switch {
			case s.c.closed():
				return
			case errors.Is(err, redis.ErrClosed):
				// The go-redis client was closed under the Client: no
				// outage, and nothing will reconnect.
				s.c.opts.logger.DebugContext(context.Background(), "lock: pub/sub ends: its Redis client was closed", "err", err)
				return
			case errors.Is(err, net.ErrClosed):
				// Closed on this side (the go-redis client closing): the
				// next receive says whether it reconnects.
				s.c.opts.logger.DebugContext(context.Background(), "lock: pub/sub connection closed locally", "err", err)
			case !broken:
				broken = true
				s.c.opts.logger.WarnContext(context.Background(), "lock: pub/sub connection broken; waiters fall back to lease timeouts until it is back", "err", err)
			}
			if pc.sharded {
				if s.moved(pc) {
					s.abandon(pc)
					return
				}
				// Have go-redis look for a new master of the node's
				// slots, in the background, for the next look.
				s.c.rdb.(*redis.ClusterClient).ReloadState(context.Background())
			}
			backoff = min(2*backoff+10*time.Millisecond, time.Second)
			select {
			case <-time.After(backoff):
			case <-s.c.done:
				return
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Message:
			if d, ok := leaseMessage(m.Payload); ok {
				s.to.learnLease(m.Channel, d)
			} else {
				s.to.deliver(m.Channel)
			}
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				if broken {
					broken = false
					s.c.opts.logger.InfoContext(context.Background(), "lock: pub/sub connection restored")
				}
				s.confirm(m.Channel)
			case "sunsubscribe":
				s.dropped(pc, m.Channel)
			}
		}
	}
}

// confirm marks channel subscribed. A channel confirmed again was
// resubscribed after a reconnect: its head waiter tries again in case the
// unlock it waits for happened meanwhile.
func (s *subscriber) confirm(channel string) {
	s.mu.Lock()
	cs := s.chans[channel]
	again := cs != nil && cs.confirmed
	if cs != nil && !cs.confirmed {
		cs.confirmed = true
		close(cs.ready)
	}
	s.mu.Unlock()
	if again {
		s.to.deliver(channel)
	}
}

// dropped handles a shard channel the server unsubscribed by itself on pc
// (its slot moved to another node): the subscription is forgotten and the
// head waiter tries again, subscribing on the new node if it still has to
// wait. The reply to this Client's own SUNSUBSCRIBE looks the same: it
// concerns an earlier subscription when the channel's current one is not
// confirmed yet (the server answers in order, and a new subscription is sent
// only after the old one's SUNSUBSCRIBE) or lives on another connection.
func (s *subscriber) dropped(pc *psConn, channel string) {
	s.mu.Lock()
	cs := s.chans[channel]
	if cs == nil || cs.refs == 0 || !cs.confirmed || cs.conn != pc {
		s.mu.Unlock()
		return
	}
	delete(s.chans, channel)
	conn := cs.conn
	s.mu.Unlock()
	ctx, cancel := s.c.backgroundContext(5 * time.Second)
	_ = conn.ps.SUnsubscribe(ctx, s.withMark(channel)...) // forget it in go-redis too, or it resubscribes on reconnect
	cancel()
	s.to.resubscribe(channel, cs)
}

// moved reports whether the node of pc, a shard channel connection that
// broke, no longer serves the slots of the channels subscribed on it (a
// failover promoted a replica, or a slot moved while the node was
// unreachable): go-redis would reconnect to the old node for ever, and the
// waiters on those channels would hear nothing but their lease bounds. A
// connection without channels counts as moved: connFor opens a new one
// when its node is needed again.
func (s *subscriber) moved(pc *psConn) bool {
	s.mu.Lock()
	var chans []string
	for ch, cs := range s.chans {
		if cs.conn == pc {
			chans = append(chans, ch)
		}
	}
	s.mu.Unlock()
	ctx, cancel := s.c.backgroundContext(time.Second)
	defer cancel()
	for _, ch := range chans {
		node, err := s.c.rdb.(*redis.ClusterClient).MasterForKey(ctx, ch)
		if err == nil && node.Options().Addr != pc.addr {
			return true
		}
	}
	return len(chans) == 0
}

// abandon closes pc, whose node no longer serves its channels (see moved),
// and forgets their subscriptions: the head waiters of those channels try
// again at once and subscribe on the channels' new node if they still have
// to wait; a subscription not yet confirmed fails, and its waiter with it.
func (s *subscriber) abandon(pc *psConn) {
	s.mu.Lock()
	if s.conns[pc.addr] == pc {
		delete(s.conns, pc.addr)
	}
	var gone []*chanSub
	for ch, cs := range s.chans {
		if cs.conn == pc {
			delete(s.chans, ch)
			gone = append(gone, cs)
		}
	}
	s.mu.Unlock()
	// The connection's channels are the waiters of many requests: no one
	// request's context to log with.
	s.c.opts.logger.InfoContext(context.Background(), "lock: shard channels moved to another node; subscribing there", "from", pc.addr, "channels", len(gone))
	_ = pc.ps.Close()
	for _, cs := range gone {
		s.fail(cs, fmt.Errorf("the node %s no longer serves %s", pc.addr, cs.channel))
		s.to.resubscribe(cs.channel, cs)
	}
}

// listening returns how many subscriptions this Client has on channel in
// the server's count: 1 while it is subscribed, else 0.
func (s *subscriber) listening(channel string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cs := s.chans[channel]; cs != nil && cs.confirmed && cs.err == nil {
		return 1
	}
	return 0
}

// close closes every pub/sub connection; their reading goroutines end.
func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*psConn, 0, len(s.conns))
	for _, pc := range s.conns {
		conns = append(conns, pc)
	}
	for _, cs := range s.chans {
		if cs.idle != nil {
			cs.idle.Stop()
		}
	}
	s.mu.Unlock()
	for _, pc := range conns {
		if err := pc.ps.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			// Close, not any request, ends the connection.
			s.c.opts.logger.DebugContext(context.Background(), "lock: closing pub/sub", "err", err)
		}
	}
}

// leaseMessage parses the message fair_acquire.lua sends the next waiter in
// a FairMutex's line: "-<ms>", the lease the lock was just taken with.
func leaseMessage(payload string) (time.Duration, bool) {
	if len(payload) < 2 || payload[0] != '-' {
		return 0, false
	}
	ms, err := strconv.ParseInt(payload[1:], 10, 64)
	if err != nil || ms <= 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}
