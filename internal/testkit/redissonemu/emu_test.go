package redissonemu

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// These tests pin the protocol facts the emulator must reproduce (they were
// also checked against the real Java client on the same keys).

func newClient(t *testing.T, srv *testenv.RedisServer, cfg Config) *Client {
	t.Helper()
	c := New(srv.Client(), cfg)
	t.Cleanup(c.Close)
	return c
}

func score(t *testing.T, srv *testenv.RedisServer, key, member string) int64 {
	t.Helper()
	switch v := srv.Do("ZSCORE", key, member).(type) {
	case float64:
		return int64(v)
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return int64(f)
	}
	t.Fatalf("no score for %s in %s", member, key)
	return 0
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestFairLock_DeadlinesChainByEachWaitAndTheTakerLowersThem(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	l := c.FairLock("f")
	if err := l.Lock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMilli()
	done := make(chan error, 2)
	go func() { done <- l.Lock(ctx, 2) }()
	waitUntil(t, "thread 2 in line", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{f}") == int64(1) })
	go func() { _, err := l.TryLock(ctx, 3, 20*time.Second, 0); done <- err }()
	waitUntil(t, "thread 3 in line", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{f}") == int64(2) })
	after := time.Now().UnixMilli()

	s2 := score(t, srv, "redisson_lock_timeout:{f}", c.Field(2))
	// the holder's remaining lease (≤ 30 s) + now + fairLockWaitTimeout (5 min)
	if s2 < before+29000+300000 || s2 > after+30000+300000 {
		t.Fatalf("thread 2's deadline %d, want about now + 30 s lease + 5 min (now %d..%d)", s2, before, after)
	}
	s3 := score(t, srv, "redisson_lock_timeout:{f}", c.Field(3))
	if s3 != s2+20000 {
		t.Fatalf("thread 3's deadline %d, want thread 2's %d + its own wait 20000", s3, s2)
	}
	if err := l.Unlock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := score(t, srv, "redisson_lock_timeout:{f}", c.Field(3)); got != s3-300000 {
		t.Fatalf("after thread 2 took the lock thread 3's deadline is %d, want %d - thread 2's wait", got, s3)
	}
	l.Unlock(ctx, 2)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l.Unlock(ctx, 3)
}

func TestFairLock_AStaleHeadIsDroppedByTheNextAttemptAndNoOneBehindIt(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	srv.Do("RPUSH", "redisson_lock_queue:{f}", "dead:1", "live:1", "dead:2")
	srv.Do("ZADD", "redisson_lock_timeout:{f}", now-1000, "dead:1", now+60000, "live:1", now-1000, "dead:2")
	if ok, err := c.FairLock("f").TryLockOnce(ctx, 9); err != nil || ok {
		t.Fatalf("TryLockOnce = %v, %v; want false: live:1 is first once dead:1 is dropped", ok, err)
	}
	if got := srv.Do("LRANGE", "redisson_lock_queue:{f}", 0, -1); len(got.([]any)) != 2 || got.([]any)[0] != "live:1" {
		t.Fatalf("line %v, want [live:1 dead:2]: only stale heads are dropped", got)
	}
}

func TestFairLock_AGivenUpWaiterLowersTheDeadlinesBehindIt(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	l := c.FairLock("f")
	l.Lock(ctx, 1)
	res := make(chan bool, 1)
	go func() { ok, _ := l.TryLock(ctx, 2, 300*time.Millisecond, 0); res <- ok }()
	waitUntil(t, "thread 2 in line", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{f}") == int64(1) })
	go l.Lock(ctx, 3)
	waitUntil(t, "thread 3 in line", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{f}") == int64(2) })
	s3 := score(t, srv, "redisson_lock_timeout:{f}", c.Field(3))
	if <-res {
		t.Fatal("thread 2 got a lock that was held")
	}
	if got := score(t, srv, "redisson_lock_timeout:{f}", c.Field(3)); got != s3-300 {
		t.Fatalf("thread 3's deadline %d after thread 2 gave up, want %d - 300", got, s3)
	}
	l.Unlock(ctx, 1)
}

// RedissonLock.lock() calls no acquireFailed when its thread is interrupted
// (only tryLock does): the place stays in line until it goes stale, which is
// how a JVM that dies while waiting leaves it too.
func TestFairLock_AnInterruptedLockKeepsItsPlace(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	l := c.FairLock("f")
	l.Lock(ctx, 1)
	wctx, interrupt := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Lock(wctx, 2) }()
	waitUntil(t, "thread 2 in line", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{f}") == int64(1) })
	interrupt()
	if err := <-done; err == nil {
		t.Fatal("the interrupted lock() returned no error")
	}
	if srv.Do("LLEN", "redisson_lock_queue:{f}") != int64(1) {
		t.Fatal("the interrupted lock() left the line")
	}
	score(t, srv, "redisson_lock_timeout:{f}", c.Field(2))
	l.Unlock(ctx, 1)
}

func TestFairLock_UnlockTellsTheFirstWaiterOnItsOwnChannelOnly(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	ps := srv.Client().PSubscribe(ctx, "redisson_lock__channel*")
	defer ps.Close()
	ps.Receive(ctx)
	l := c.FairLock("f")
	l.Lock(ctx, 1)
	srv.Do("RPUSH", "redisson_lock_queue:{f}", "next:7")
	srv.Do("ZADD", "redisson_lock_timeout:{f}", time.Now().UnixMilli()+60000, "next:7")
	l.Unlock(ctx, 1)
	m, err := ps.ReceiveMessage(ctx)
	if err != nil || m.Channel != "redisson_lock__channel:{f}:next:7" || m.Payload != "0" {
		t.Fatalf("message %v (%v), want 0 on redisson_lock__channel:{f}:next:7", m, err)
	}
}

func TestReadLock_UnlockKeepsTheHashForTheLongestReaderTimeoutKey(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	rw := c.ReadWriteLock("rw")
	if err := rw.ReadLock().LockLease(ctx, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := rw.ReadLock().LockLease(ctx, 2, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if srv.Do("EXISTS", "{rw}:"+c.Field(1)+":rwlock_timeout:1") != int64(1) {
		t.Fatal("no timeout key for the first read level")
	}
	rw.ReadLock().Unlock(ctx, 1)
	if p := srv.Do("PTTL", "rw").(int64); p <= 0 || p > 2000 {
		t.Fatalf("hash PTTL %d after the 10 s reader left, want thread 2's ≤ 2 s", p)
	}
}

func TestReadLock_AReaderWithoutTimeoutKeysCountsForNothing(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	srv.Do("HSET", "rw", "mode", "read", "other:5", 1)
	srv.Do("PEXPIRE", "rw", 30000)
	rw := c.ReadWriteLock("rw")
	rw.ReadLock().Lock(ctx, 1)
	rw.ReadLock().Unlock(ctx, 1)
	if srv.Do("EXISTS", "rw") != int64(0) {
		t.Fatal("the hash survived a read unlock although the other reader has no timeout key")
	}
}

func TestWriteLock_TakesOnlyAnAbsentHashAndItsLastUnlockSendsOne(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	rw := c.ReadWriteLock("rw")
	rw.ReadLock().Lock(ctx, 1)
	if ok, _ := rw.WriteLock().TryLock(ctx, 2, 0, 0); ok {
		t.Fatal("a writer entered beside a reader")
	}
	rw.ReadLock().Unlock(ctx, 1)
	ps := srv.Client().Subscribe(ctx, "redisson_rwlock:{rw}")
	defer ps.Close()
	ps.Receive(ctx)
	if ok, _ := rw.WriteLock().TryLock(ctx, 2, 0, 0); !ok {
		t.Fatal("a writer could not take a free lock")
	}
	if srv.Do("HGET", "rw", c.Field(2)+":write") != "1" {
		t.Fatal("no write field")
	}
	rw.WriteLock().Unlock(ctx, 2)
	if m, err := ps.ReceiveMessage(ctx); err != nil || m.Payload != "1" {
		t.Fatalf("message %v (%v), want 1", m, err)
	}
}

func TestSemaphore_ReleaseSendsTheCountAndWakesAWaiter(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	s := c.Semaphore("s")
	if ok, _ := s.TrySetPermits(ctx, 1); !ok {
		t.Fatal("TrySetPermits on a new name")
	}
	if ok, _ := s.TrySetPermits(ctx, 5); ok {
		t.Fatal("TrySetPermits changed an existing counter")
	}
	s.Acquire(ctx)
	got := make(chan time.Time, 1)
	go func() { s.Acquire(ctx); got <- time.Now() }()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	s.Release(ctx)
	select {
	case at := <-got:
		if at.Sub(released) > time.Second {
			t.Fatalf("woken %v after the release", at.Sub(released))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken")
	}
}

func TestPermitExpirableSemaphore_AnExpiredPermitComesBack(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{})
	ctx := context.Background()
	p := c.PermitExpirableSemaphore("p")
	p.TrySetPermits(ctx, 1)
	id, err := p.Acquire(ctx, 200*time.Millisecond)
	if err != nil || len(id) != 32 {
		t.Fatalf("Acquire = %q, %v", id, err)
	}
	if srv.Do("ZCARD", "{p}:timeout") != int64(1) || srv.Do("GET", "p") != "0" {
		t.Fatal("permit not recorded in {p}:timeout, or counter not lowered")
	}
	start := time.Now()
	id2, err := p.TryAcquire(ctx, 3*time.Second, 0)
	if err != nil || id2 == "" {
		t.Fatalf("second Acquire = %q, %v", id2, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the expired permit came back after %v, want about 200 ms", d)
	}
	if err := p.Release(ctx, id); err != ErrNoPermit {
		t.Fatalf("releasing the expired permit = %v, want ErrNoPermit", err)
	}
	if err := p.Release(ctx, id2); err != nil {
		t.Fatal(err)
	}
}

func TestNameMapper_PrefixesTheNameBeforeKeysAreDerived(t *testing.T) {
	srv := testenv.Redis(t)
	c := newClient(t, srv, Config{NameMapper: func(n string) string { return "svc:" + n }})
	ctx := context.Background()
	c.FairLock("a").Lock(ctx, 1)
	done := make(chan error, 1)
	go func() { done <- c.FairLock("a").Lock(ctx, 2) }()
	waitUntil(t, "a waiter", func() bool { return srv.Do("LLEN", "redisson_lock_queue:{svc:a}") == int64(1) })
	if srv.Do("EXISTS", "svc:a") != int64(1) || srv.Do("EXISTS", "redisson_lock_timeout:{svc:a}") != int64(1) {
		t.Fatal("keys not derived from the mapped name")
	}
	c.FairLock("a").Unlock(ctx, 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
