package redissonemu

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"time"
)

var (
	semAcquire    = script("sem_acquire")
	semRelease    = script("sem_release")
	semSetPermits = script("sem_setpermits")
	pesAcquire    = script("pes_acquire", "peslib")
	pesRelease    = script("pes_release")
	pesUpdate     = script("pes_update", "peslib")
)

// neverExpires is the score RPermitExpirableSemaphore gives a permit taken
// without a lease.
const neverExpires = "922337203685477"

// ErrNoPermit is what Redisson reports as IllegalArgumentException when a
// permit id is released that is not handed out.
var ErrNoPermit = errors.New("redissonemu: no such permit")

// A Semaphore is an RSemaphore: a counter of free permits under the name
// itself, and the channel "redisson_sc:{<name>}" carrying the count after
// each release.
type Semaphore struct {
	c       *Client
	key, ch string
}

// Semaphore returns the RSemaphore called name.
func (c *Client) Semaphore(name string) *Semaphore {
	k := c.cfg.NameMapper(name)
	return &Semaphore{c: c, key: k, ch: Prefixed("redisson_sc", k)}
}

// TrySetPermits creates the counter with n permits when there is none.
func (s *Semaphore) TrySetPermits(ctx context.Context, n int) (bool, error) {
	r, err := semSetPermits.Run(ctx, s.c.rdb, []string{s.key, s.ch}, n, s.c.publish).Int64()
	return r == 1, err
}

// Acquire waits for a permit.
func (s *Semaphore) Acquire(ctx context.Context) error {
	_, err := s.TryAcquire(ctx, -1)
	return err
}

// TryAcquire waits at most wait for a permit (negative: without bound).
func (s *Semaphore) TryAcquire(ctx context.Context, wait time.Duration) (bool, error) {
	try := func() (bool, int64, error) {
		n, err := semAcquire.Run(ctx, s.c.rdb, []string{s.key}, 1).Int64()
		return n == 1, -1, err
	}
	return waitFor(ctx, s.c, s.ch, wait, try)
}

// Release gives a permit back (any thread may).
func (s *Semaphore) Release(ctx context.Context) error {
	return semRelease.Run(ctx, s.c.rdb, []string{s.key, s.ch}, 1, s.c.publish).Err()
}

// waitFor runs try until it succeeds, waiting between tries on the
// channel's semaphore messages, at most the time try returned (ms, < 0: no
// bound), at most wait in all (< 0: no bound).
func waitFor(ctx context.Context, c *Client, ch string, wait time.Duration, try func() (bool, int64, error)) (bool, error) {
	start := time.Now()
	ok, _, err := try()
	if err != nil || ok || wait == 0 {
		return ok, err
	}
	sub, err := c.subscribe(ctx, ch, semaphoreMessages)
	if err != nil {
		return false, err
	}
	defer c.unsubscribe(ch, sub)
	for {
		ok, d, err := try()
		if err != nil || ok {
			return ok, err
		}
		bound := time.Duration(-1)
		if d >= 0 {
			bound = time.Duration(d) * time.Millisecond
		}
		if wait > 0 {
			left := wait - time.Since(start)
			if left <= 0 {
				return false, nil
			}
			if bound < 0 || bound > left {
				bound = left
			}
		}
		if err := sub.await(ctx, bound); err != nil {
			return false, err
		}
		if d := c.cfg.WakeDelay; d > 0 {
			time.Sleep(d)
		}
	}
}

// A PermitExpirableSemaphore is an RPermitExpirableSemaphore: the counter
// of free permits under the name, the permits handed out in the sorted set
// "{<name>}:timeout" (permit id, 16 random bytes -> expiry in ms of the
// Java client's clock), and the channel "redisson_sc:{<name>}".
type PermitExpirableSemaphore struct {
	c                *Client
	key, permits, ch string
}

// PermitExpirableSemaphore returns the RPermitExpirableSemaphore called name.
func (c *Client) PermitExpirableSemaphore(name string) *PermitExpirableSemaphore {
	k := c.cfg.NameMapper(name)
	return &PermitExpirableSemaphore{c: c, key: k, permits: Suffixed(k, "timeout"), ch: Prefixed("redisson_sc", k)}
}

// TrySetPermits creates the counter with n permits when there is none.
func (p *PermitExpirableSemaphore) TrySetPermits(ctx context.Context, n int) (bool, error) {
	r, err := semSetPermits.Run(ctx, p.c.rdb, []string{p.key, p.ch}, n, p.c.publish).Int64()
	return r == 1, err
}

// Acquire waits for a permit; lease 0: it never expires. It returns the
// permit's id (hex).
func (p *PermitExpirableSemaphore) Acquire(ctx context.Context, lease time.Duration) (string, error) {
	return p.TryAcquire(ctx, -1, lease)
}

// TryAcquire waits at most wait for a permit (negative: without bound) and
// returns its id, "" when none came.
func (p *PermitExpirableSemaphore) TryAcquire(ctx context.Context, wait, lease time.Duration) (string, error) {
	id := newPermitID()
	raw, _ := hex.DecodeString(id)
	try := func() (bool, int64, error) {
		now := p.c.now()
		expiry := neverExpires
		if lease > 0 {
			expiry = strconv.FormatInt(now+ms(lease), 10)
		}
		ok, nearest, err := reply(pesAcquire.Run(ctx, p.c.rdb, []string{p.key, p.permits, p.ch},
			1, expiry, now, neverExpires, p.c.publish, raw).Result())
		if err != nil || ok || nearest < 0 {
			return ok, -1, err
		}
		return false, max(nearest-p.c.now(), 0), nil
	}
	ok, err := waitFor(ctx, p.c, p.ch, wait, try)
	if !ok || err != nil {
		return "", err
	}
	return id, nil
}

// Release gives the permit back; ErrNoPermit when it is not handed out.
func (p *PermitExpirableSemaphore) Release(ctx context.Context, id string) error {
	raw, err := hex.DecodeString(id)
	if err != nil {
		return err
	}
	n, err := pesRelease.Run(ctx, p.c.rdb, []string{p.key, p.permits, p.ch}, raw, p.c.now(), p.c.publish).Int64()
	if err == nil && n < 0 {
		return ErrNoPermit
	}
	return err
}

// UpdateLeaseTime gives a permit still handed out a new lease from now.
func (p *PermitExpirableSemaphore) UpdateLeaseTime(ctx context.Context, id string, lease time.Duration) (bool, error) {
	raw, err := hex.DecodeString(id)
	if err != nil {
		return false, err
	}
	now := p.c.now()
	n, err := pesUpdate.Run(ctx, p.c.rdb, []string{p.key, p.permits, p.ch}, raw, now+ms(lease), now, p.c.publish).Int64()
	return n == 1, err
}
