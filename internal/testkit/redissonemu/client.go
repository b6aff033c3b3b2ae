// Package redissonemu plays a Java service on Redisson in tests: it speaks
// the Redis protocol of Redisson's RLock, RFairLock, RReadWriteLock,
// RSemaphore and RPermitExpirableSemaphore (keys, values, scores, channels
// and messages), so that the lock package's kinds can be tested against it
// on one name without a JVM. It is written from a description of that
// protocol (the project's notes on Redisson interop), not from Redisson's
// code, and it was checked against the real Java client on the same names.
//
// Threads are explicit: every call names the Java thread (an int64) it
// stands for, and a Client has the id Redisson's connection manager would
// have, so an owner field is "<client id>:<thread id>". A Client waits the
// way Redisson does: one subscription per channel per Client shared by all
// its waiting threads, an unlock message "0" letting one of them try again
// and "1" all of them, and each wait also bounded by the PTTL (or, for a
// fair lock, the time) the attempt returned. Holds without a lease are
// renewed every watchdog timeout / 3 until unlocked or Abandoned (a JVM
// that died).
//
// Test harness only: it starts a goroutine per renewed hold and per
// subscription, which production code must not.
package redissonemu

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// script loads scripts/<name>.lua behind the libraries it names.
func script(name string, libs ...string) *redis.Script {
	var b strings.Builder
	for _, f := range append(libs, name) {
		src, err := scriptFiles.ReadFile("scripts/" + f + ".lua")
		if err != nil {
			panic(err)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return redis.NewScript(b.String())
}

// ErrNotHeld is what Redisson reports as IllegalMonitorStateException: an
// unlock by a thread that does not hold the lock.
var ErrNotHeld = errors.New("redissonemu: not held by this thread")

// Defaults of Redisson's Config.
const (
	DefaultLockWatchdogTimeout = 30 * time.Second
	DefaultFairLockWaitTimeout = 5 * time.Minute
)

// Config is the part of Redisson's Config the lock kinds read.
type Config struct {
	// ID is the connection manager's id (a UUID); a new one when empty.
	ID string
	// LockWatchdogTimeout is the lease of a hold taken without one, renewed
	// every third of it. Default DefaultLockWatchdogTimeout.
	LockWatchdogTimeout time.Duration
	// FairLockWaitTimeout is a fair waiter's wait when it does not give one
	// (Lock, TryLock with wait 0). Default DefaultFairLockWaitTimeout.
	FairLockWaitTimeout time.Duration
	// NameMapper maps every object name before any key is derived from it,
	// as Redisson's NameMapper does. Default: the name itself.
	NameMapper func(string) string
	// ClockSkew is added to the host's clock wherever the Java client sends
	// its own clock (fair-lock deadlines, permit expiries).
	ClockSkew time.Duration
	// WakeDelay is how long a lock or semaphore waiter takes, once woken (by
	// a message or its ttl), before its next attempt: a JVM thread parked on a
	// semaphore that the pub/sub thread releases runs later than a
	// goroutine, the more so on a loaded host. Default 0.
	WakeDelay time.Duration
}

// A Client stands for one Redisson instance (one JVM).
type Client struct {
	rdb     redis.UniversalClient
	cfg     Config
	publish string

	mu   sync.Mutex
	subs map[string]*subscription
	// renewing: a stop function per renewed hold, by "<kind>|<key>|<field>"
	renewing map[string]context.CancelFunc
	closed   bool
}

// New returns a Client on rdb. A Cluster client publishes with SPUBLISH and
// subscribes with SSUBSCRIBE, as Redisson does on a cluster with sharded
// pub/sub.
func New(rdb redis.UniversalClient, cfg Config) *Client {
	if cfg.ID == "" {
		cfg.ID = uuid.NewString()
	}
	if cfg.LockWatchdogTimeout <= 0 {
		cfg.LockWatchdogTimeout = DefaultLockWatchdogTimeout
	}
	if cfg.FairLockWaitTimeout <= 0 {
		cfg.FairLockWaitTimeout = DefaultFairLockWaitTimeout
	}
	if cfg.NameMapper == nil {
		cfg.NameMapper = func(s string) string { return s }
	}
	c := &Client{rdb: rdb, cfg: cfg, publish: "publish", subs: map[string]*subscription{}, renewing: map[string]context.CancelFunc{}}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		c.publish = "spublish"
	}
	return c
}

// ID returns the client id every owner field of this Client starts with.
func (c *Client) ID() string { return c.cfg.ID }

// Field returns the owner field of thread: "<client id>:<thread>".
func (c *Client) Field(thread int64) string { return fmt.Sprintf("%s:%d", c.cfg.ID, thread) }

// Close stops every renewal (the holds stay in Redis until their leases
// end, as when a JVM dies) and every subscription.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	for k, stop := range c.renewing {
		stop()
		delete(c.renewing, k)
	}
	subs := c.subs
	c.subs = map[string]*subscription{}
	c.mu.Unlock()
	for _, s := range subs {
		s.close()
	}
}

// now is the Java client's clock in ms.
func (c *Client) now() int64 { return time.Now().Add(c.cfg.ClockSkew).UnixMilli() }

// Prefixed derives a key from name the way Redisson names its companions:
// "prefix:name" when name holds a '{' already, else "prefix:{name}".
func Prefixed(prefix, name string) string {
	if strings.Contains(name, "{") {
		return prefix + ":" + name
	}
	return prefix + ":{" + name + "}"
}

// Suffixed derives a key from name with a suffix: "name:suffix" when name
// holds a '{', else "{name}:suffix".
func Suffixed(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

// renew starts renewing a hold every watchdog timeout / 3 with fn, which
// reports whether the hold is still there; key identifies the hold.
func (c *Client) renew(key string, fn func(ctx context.Context) (bool, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if _, ok := c.renewing[key]; ok {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	c.renewing[key] = stop
	go func() {
		t := time.NewTicker(c.cfg.LockWatchdogTimeout / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if ok, err := fn(ctx); err == nil && !ok {
					c.stopRenewal(key)
					return
				}
			}
		}
	}()
}

func (c *Client) stopRenewal(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stop, ok := c.renewing[key]; ok {
		stop()
		delete(c.renewing, key)
	}
}

// Renewing reports whether the Client still renews the hold key (for tests
// of a hold found gone).
func (c *Client) renewingHold(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.renewing[key]
	return ok
}

// A subscription is a Client's one subscription to a channel, shared by all
// its threads waiting on it, with a latch like Redisson's: a message lets a
// number of waiters through, and a permit nobody takes stays for the next
// one.
type subscription struct {
	ps      *redis.PubSub
	refs    int // threads sharing it; under mu (and the Client's mu when it changes)
	latch   chan struct{}
	waiting int
	mu      sync.Mutex
	done    chan struct{}
}

// onMessage says how many waiters a message lets through, given how many
// wait and how many threads share the subscription.
type onMessage func(msg string, waiting, refs int) int

// lockMessages: "0" lets one waiter through, "1" every waiter; any other
// message is ignored.
func lockMessages(msg string, waiting, _ int) int {
	switch msg {
	case "0":
		return 1
	case "1":
		return waiting
	}
	return 0
}

// semaphoreMessages: the message is the count of permits now free; it lets
// through that many of the threads subscribed, at most.
func semaphoreMessages(msg string, _, refs int) int {
	var n int
	if _, err := fmt.Sscan(msg, &n); err != nil || n < 0 {
		return 0
	}
	return min(n, refs)
}

func (c *Client) subscribe(ctx context.Context, channel string, on onMessage) (*subscription, error) {
	c.mu.Lock()
	if s, ok := c.subs[channel]; ok {
		s.mu.Lock()
		s.refs++
		s.mu.Unlock()
		c.mu.Unlock()
		return s, nil
	}
	var ps *redis.PubSub
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		ps = cc.SSubscribe(ctx, channel)
	} else {
		ps = c.rdb.Subscribe(ctx, channel)
	}
	s := &subscription{ps: ps, refs: 1, latch: make(chan struct{}, 1<<14), done: make(chan struct{})}
	c.subs[channel] = s
	c.mu.Unlock()
	if _, err := ps.Receive(ctx); err != nil {
		c.unsubscribe(channel, s)
		return nil, err
	}
	go func() {
		defer close(s.done)
		for m := range ps.Channel() {
			s.mu.Lock()
			n := on(m.Payload, s.waiting, s.refs)
			s.mu.Unlock()
			for range n {
				select {
				case s.latch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return s, nil
}

func (c *Client) unsubscribe(channel string, s *subscription) {
	c.mu.Lock()
	s.mu.Lock()
	s.refs--
	last := s.refs == 0 && c.subs[channel] == s
	s.mu.Unlock()
	if last {
		delete(c.subs, channel)
	}
	c.mu.Unlock()
	if last {
		s.close()
	}
}

func (s *subscription) close() { s.ps.Close() }

// await waits for a permit of the latch, at most d (d < 0: without bound),
// or until ctx ends.
func (s *subscription) await(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}()
	var timeout <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-s.latch:
	case <-timeout:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// newPermitID returns a 128-bit random permit id in hex, as Redisson's.
func newPermitID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
