package lock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A link is what every part of a Client's engine works through: its go-redis
// client, its options and script arguments, the owner ids it hands out and
// the life of its background goroutines. The Client makes one in New; the
// watchdog, the subscriber and the waiting lines receive it rather than the
// Client, and the engine is built on it, so nothing below the Client reaches
// back up to it.
type link struct {
	rdb      redis.UniversalClient
	id       string // Redisson's connection manager id: the first half of every owner field
	cluster  bool   // Redis Cluster: shard channels, renewals grouped by slot
	publish  any    // "publish" or "spublish", boxed once: it is an argument of most scripts
	leaseMS  any    // the watchdog timeout as a script argument (msArg), boxed once
	tokenTTL any    // the token counters' idle expiry in milliseconds, "0" for none (WithTokenExpiry)
	opts     clientOptions
	err      error // set when New got bad input; returned by every operation

	owners atomic.Int64 // the last owner id handed out

	life    context.Context // cancelled by Close; parent of the Client's own calls
	end     context.CancelFunc
	done    <-chan struct{} // life.Done()
	bgmu    sync.Mutex
	closing bool           // guarded by bgmu: no new background goroutine
	bg      sync.WaitGroup // background goroutines, waited for by Close
}

// closed reports whether the link's Client has been closed.
func (c *link) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// key returns the Redis key of the lock called name.
func (c *link) key(name string) string {
	if c.opts.namespace == "" {
		return name
	}
	return c.opts.namespace + ":" + name
}

// goBackground runs f in a goroutine that Close waits for. It reports false,
// and does not run f, once the Client is closing.
func (c *link) goBackground(f func()) bool {
	c.bgmu.Lock()
	defer c.bgmu.Unlock()
	if c.closing {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}

// stopBackground lets no new background goroutine start and ends the
// link's life: the first step of Close.
func (c *link) stopBackground() {
	c.bgmu.Lock()
	c.closing = true
	c.bgmu.Unlock()
	c.end()
}

// backgroundContext returns a context for the Client's own Redis calls:
// bounded by d and cancelled when the Client closes.
func (c *link) backgroundContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.life, d)
}

// usable returns the error every operation of the link's Client starts
// with, if any: bad input to New, or Close called.
func (c *link) usable() error {
	if c.err != nil {
		return c.err
	}
	if c.closed() {
		return ErrClosed
	}
	return nil
}

// lockOptions applies opts over the Client's defaults.
func (c *link) lockOptions(opts []LockOption) lockOptions {
	if len(opts) == 0 { // the options' pointer below puts o on the heap
		return lockOptions{ack: c.opts.ack}
	}
	o := lockOptions{ack: c.opts.ack}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// conn returns a connection of its own to the master that holds key, so that
// WAIT counts the replicas that confirmed this connection's last write.
func (c *link) conn(ctx context.Context, key string) (*redis.Conn, error) {
	switch r := c.rdb.(type) {
	case *redis.Client:
		return r.Conn(), nil
	case *redis.ClusterClient:
		node, err := r.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("%w: replica acknowledgement needs a *redis.Client or *redis.ClusterClient", ErrInvalid)
}

// confirmReplicas waits until ack.replicas replicas have confirmed the writes
// made on conn, for at most ack.timeout.
func (c *link) confirmReplicas(ctx context.Context, conn *redis.Conn, ack replicaAck) error {
	n, err := conn.Wait(ctx, ack.replicas, ack.timeout).Result()
	if err != nil {
		return fmt.Errorf("waiting for %d replicas: %w", ack.replicas, err)
	}
	if int(n) < ack.replicas {
		return fmt.Errorf("%w: %d of %d replicas confirmed within %v", ErrNotReplicated, n, ack.replicas, ack.timeout)
	}
	return nil
}

// numsub is the PUBSUB subcommand that counts a channel's subscribers in a
// script: SHARDNUMSUB for the sharded channels of a Cluster.
func (c *link) numsub() string {
	if c.cluster {
		return "shardnumsub"
	}
	return "numsub"
}
