package redissonemu

import (
	"context"
	"fmt"
	"strings"
	"time"
)

var (
	lockAcquire  = script("lock_acquire")
	lockRelease  = script("lock_release")
	lockRenew    = script("renew")
	fairAcquire  = script("fair_acquire", "fairlib")
	fairLeave    = script("fair_leave")
	fairRelease  = script("fair_release", "fairlib")
	readAcquire  = script("read_acquire")
	readRelease  = script("read_release")
	readRenew    = script("read_renew")
	writeAcquire = script("write_acquire")
	writeRelease = script("write_release")
)

// protocol is what differs between the lock kinds: their scripts, keys and
// channels.
type protocol interface {
	// attempt tries once; when not acquired, ttl is how long to wait for a
	// message at most (ms, negative: without bound). wait is the caller's
	// wait (negative: none given), once a tryLock() without a wait.
	attempt(ctx context.Context, thread int64, wait, lease time.Duration, once bool) (acquired bool, ttl int64, err error)
	// release drops one level: -1 not held, 0 still held, 1 released.
	release(ctx context.Context, thread int64, lease time.Duration) (int64, error)
	renewHold(ctx context.Context, thread int64) (bool, error)
	// channel is the channel the thread waits on.
	channel(thread int64) string
	// giveUp is called when a wait ran out (RFairLock leaves its line).
	giveUp(ctx context.Context, thread int64, wait time.Duration) error
}

// A Lock is one of Redisson's reentrant locks on a name: an RLock, an
// RFairLock, or either lock of an RReadWriteLock.
type Lock struct {
	c     *Client
	key   string // the mapped name
	label string
	p     protocol
}

// Lock returns the RLock called name.
func (c *Client) Lock(name string) *Lock {
	k := c.cfg.NameMapper(name)
	return &Lock{c: c, key: k, label: "lock", p: plainLock{c: c, key: k, ch: Prefixed("redisson_lock__channel", k)}}
}

// FairLock returns the RFairLock called name.
func (c *Client) FairLock(name string) *Lock {
	k := c.cfg.NameMapper(name)
	return &Lock{c: c, key: k, label: "fair", p: fairLock{plainLock{c: c, key: k, ch: Prefixed("redisson_lock__channel", k)},
		Prefixed("redisson_lock_queue", k), Prefixed("redisson_lock_timeout", k)}}
}

// ReadWriteLock is an RReadWriteLock: two locks on one hash.
type ReadWriteLock struct{ read, write *Lock }

// ReadWriteLock returns the RReadWriteLock called name.
func (c *Client) ReadWriteLock(name string) ReadWriteLock {
	k := c.cfg.NameMapper(name)
	ch := Prefixed("redisson_rwlock", k)
	return ReadWriteLock{
		read:  &Lock{c: c, key: k, label: "read", p: readLock{c: c, key: k, ch: ch}},
		write: &Lock{c: c, key: k, label: "write", p: writeLock{c: c, key: k, ch: ch}},
	}
}

// ReadLock returns the read lock.
func (rw ReadWriteLock) ReadLock() *Lock { return rw.read }

// WriteLock returns the write lock.
func (rw ReadWriteLock) WriteLock() *Lock { return rw.write }

// Lock waits until thread holds the lock (lock()); the watchdog renews it.
// A ctx that ends is lockInterruptibly() interrupted: a fair waiter keeps its
// place in line until it is dropped as stale, as Redisson's does.
func (l *Lock) Lock(ctx context.Context, thread int64) error {
	_, err := l.acquire(ctx, thread, -1, 0, false)
	return err
}

// LockLease waits until thread holds the lock with a fixed lease (lock(leaseTime)).
func (l *Lock) LockLease(ctx context.Context, thread int64, lease time.Duration) error {
	_, err := l.acquire(ctx, thread, -1, lease, false)
	return err
}

// TryLock waits at most wait (tryLock(waitTime, leaseTime)); lease 0: the
// watchdog renews the hold. Wait 0 makes one attempt; a fair lock's waiter
// still joins the line for it and leaves it again, as Redisson's does.
func (l *Lock) TryLock(ctx context.Context, thread int64, wait, lease time.Duration) (bool, error) {
	return l.acquire(ctx, thread, wait, lease, false)
}

// TryLockOnce is tryLock() without arguments: one attempt that never joins
// a fair lock's line.
func (l *Lock) TryLockOnce(ctx context.Context, thread int64) (bool, error) {
	return l.acquire(ctx, thread, 0, 0, true)
}

func (l *Lock) acquire(ctx context.Context, thread int64, wait, lease time.Duration, once bool) (bool, error) {
	start := time.Now()
	left := func() time.Duration { return wait - time.Since(start) }
	ok, ttl, err := l.p.attempt(ctx, thread, wait, lease, once)
	if err != nil || ok {
		return l.acquired(thread, lease, ok, err)
	}
	if once {
		return false, nil
	}
	if wait >= 0 && left() <= 0 {
		return false, l.p.giveUp(ctx, thread, wait)
	}
	sub, err := l.c.subscribe(ctx, l.p.channel(thread), lockMessages)
	if err != nil {
		return false, err
	}
	defer l.c.unsubscribe(l.p.channel(thread), sub)
	for {
		ok, ttl, err = l.p.attempt(ctx, thread, wait, lease, false)
		if err != nil || ok {
			return l.acquired(thread, lease, ok, err)
		}
		d := time.Duration(ttl) * time.Millisecond
		if ttl < 0 {
			d = -1
		}
		if wait >= 0 {
			if left() <= 0 {
				return false, l.p.giveUp(context.WithoutCancel(ctx), thread, wait)
			}
			if d < 0 || d > left() {
				d = left()
			}
		}
		if err := sub.await(ctx, d); err != nil {
			// A tryLock gives up its place; a lock() interrupted does not
			// (Redisson calls acquireFailed from tryLock only): the place
			// stays until it is dropped as stale.
			if wait >= 0 {
				l.p.giveUp(context.WithoutCancel(ctx), thread, wait)
			}
			return false, err
		}
		if d := l.c.cfg.WakeDelay; d > 0 {
			time.Sleep(d)
		}
		if wait >= 0 && left() <= 0 {
			// tryLock checks its time after each wait and gives up
			// without another attempt.
			return false, l.p.giveUp(context.WithoutCancel(ctx), thread, wait)
		}
	}
}

func (l *Lock) acquired(thread int64, lease time.Duration, ok bool, err error) (bool, error) {
	if ok && lease <= 0 {
		l.c.renew(l.holdKey(thread), func(ctx context.Context) (bool, error) { return l.p.renewHold(ctx, thread) })
	}
	return ok, err
}

func (l *Lock) holdKey(thread int64) string { return fmt.Sprintf("%s|%s|%d", l.label, l.key, thread) }

// Unlock drops one level of thread's hold; the last one stops its renewal.
// ErrNotHeld when thread does not hold it.
func (l *Lock) Unlock(ctx context.Context, thread int64) error {
	r, err := l.p.release(ctx, thread, l.c.cfg.LockWatchdogTimeout)
	if err != nil {
		return err
	}
	if r != 0 {
		l.c.stopRenewal(l.holdKey(thread))
	}
	if r < 0 {
		return ErrNotHeld
	}
	return nil
}

// Abandon stops renewing thread's hold without unlocking it: the JVM died.
func (l *Lock) Abandon(thread int64) { l.c.stopRenewal(l.holdKey(thread)) }

// Renewing reports whether thread's hold is still renewed by the watchdog
// (false once a renewal found it gone).
func (l *Lock) Renewing(thread int64) bool { return l.c.renewingHold(l.holdKey(thread)) }

// Key returns the lock's key: the name after the NameMapper.
func (l *Lock) Key() string { return l.key }

func ms(d time.Duration) int64 { return d.Milliseconds() }

// leaseOr is the lease a hold is taken with: the given one, else the
// watchdog timeout.
func (c *Client) leaseOr(lease time.Duration) int64 {
	if lease > 0 {
		return ms(lease)
	}
	return ms(c.cfg.LockWatchdogTimeout)
}

// reply reads a {1} / {0, ttl} / {0} script reply.
func reply(v any, err error) (bool, int64, error) {
	if err != nil {
		return false, 0, err
	}
	r := v.([]any)
	if r[0].(int64) == 1 {
		return true, 0, nil
	}
	if len(r) > 1 {
		return false, r[1].(int64), nil
	}
	return false, -1, nil
}

type plainLock struct {
	c   *Client
	key string
	ch  string
}

func (p plainLock) attempt(ctx context.Context, thread int64, _, lease time.Duration, _ bool) (bool, int64, error) {
	return reply(lockAcquire.Run(ctx, p.c.rdb, []string{p.key}, p.c.leaseOr(lease), p.c.Field(thread)).Result())
}

func (p plainLock) release(ctx context.Context, thread int64, lease time.Duration) (int64, error) {
	return lockRelease.Run(ctx, p.c.rdb, []string{p.key, p.ch}, p.c.Field(thread), ms(lease), 0, p.c.publish).Int64()
}

func (p plainLock) renewHold(ctx context.Context, thread int64) (bool, error) {
	n, err := lockRenew.Run(ctx, p.c.rdb, []string{p.key}, ms(p.c.cfg.LockWatchdogTimeout), p.c.Field(thread)).Int64()
	return n == 1, err
}

func (p plainLock) channel(int64) string { return p.ch }

func (p plainLock) giveUp(context.Context, int64, time.Duration) error { return nil }

type fairLock struct {
	plainLock
	line, deadlines string
}

// waitOf is the wait a fair waiter sends: the tryLock wait when positive,
// else fairLockWaitTimeout.
func (f fairLock) waitOf(wait time.Duration) int64 {
	if wait > 0 {
		return ms(wait)
	}
	return ms(f.c.cfg.FairLockWaitTimeout)
}

func (f fairLock) attempt(ctx context.Context, thread int64, wait, lease time.Duration, once bool) (bool, int64, error) {
	mode := ""
	if once {
		mode = "once"
	}
	return reply(fairAcquire.Run(ctx, f.c.rdb, []string{f.key, f.line, f.deadlines},
		f.c.leaseOr(lease), f.c.Field(thread), f.waitOf(wait), f.c.now(), mode).Result())
}

func (f fairLock) release(ctx context.Context, thread int64, lease time.Duration) (int64, error) {
	return fairRelease.Run(ctx, f.c.rdb, []string{f.key, f.line, f.deadlines, f.ch},
		f.c.Field(thread), ms(lease), f.c.now(), f.c.publish).Int64()
}

func (f fairLock) channel(thread int64) string { return f.ch + ":" + f.c.Field(thread) }

func (f fairLock) giveUp(ctx context.Context, thread int64, wait time.Duration) error {
	return fairLeave.Run(ctx, f.c.rdb, []string{f.line, f.deadlines}, f.c.Field(thread), f.waitOf(wait)).Err()
}

type readLock struct {
	c   *Client
	key string
	ch  string
}

// timeoutPrefix is "{<name>}:<field>:rwlock_timeout", the start of the
// reader's per-level timeout keys.
func (r readLock) timeoutPrefix(thread int64) string {
	return Suffixed(r.key, r.c.Field(thread)) + ":rwlock_timeout"
}

// keyPrefix is what every reader's timeout keys start with: "{<name>}".
func (r readLock) keyPrefix() string {
	return strings.TrimSuffix(Suffixed(r.key, ""), ":")
}

func (r readLock) attempt(ctx context.Context, thread int64, _, lease time.Duration, _ bool) (bool, int64, error) {
	return reply(readAcquire.Run(ctx, r.c.rdb, []string{r.key, r.timeoutPrefix(thread)},
		r.c.leaseOr(lease), r.c.Field(thread), r.c.Field(thread)+":write").Result())
}

func (r readLock) release(ctx context.Context, thread int64, _ time.Duration) (int64, error) {
	return readRelease.Run(ctx, r.c.rdb, []string{r.key, r.ch, r.timeoutPrefix(thread), r.keyPrefix()},
		r.c.Field(thread), r.c.publish).Int64()
}

func (r readLock) renewHold(ctx context.Context, thread int64) (bool, error) {
	n, err := readRenew.Run(ctx, r.c.rdb, []string{r.key, r.keyPrefix()}, ms(r.c.cfg.LockWatchdogTimeout), r.c.Field(thread)).Int64()
	return n == 1, err
}

func (r readLock) channel(int64) string { return r.ch }

func (r readLock) giveUp(context.Context, int64, time.Duration) error { return nil }

type writeLock struct {
	c   *Client
	key string
	ch  string
}

func (w writeLock) field(thread int64) string { return w.c.Field(thread) + ":write" }

func (w writeLock) attempt(ctx context.Context, thread int64, _, lease time.Duration, _ bool) (bool, int64, error) {
	return reply(writeAcquire.Run(ctx, w.c.rdb, []string{w.key}, w.c.leaseOr(lease), w.field(thread)).Result())
}

func (w writeLock) release(ctx context.Context, thread int64, lease time.Duration) (int64, error) {
	return writeRelease.Run(ctx, w.c.rdb, []string{w.key, w.ch}, w.field(thread), ms(lease), w.c.publish).Int64()
}

func (w writeLock) renewHold(ctx context.Context, thread int64) (bool, error) {
	n, err := lockRenew.Run(ctx, w.c.rdb, []string{w.key}, ms(w.c.cfg.LockWatchdogTimeout), w.field(thread)).Int64()
	return n == 1, err
}

func (w writeLock) channel(int64) string { return w.ch }

func (w writeLock) giveUp(context.Context, int64, time.Duration) error { return nil }
