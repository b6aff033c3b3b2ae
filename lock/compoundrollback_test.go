package lock_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A RedLock that loses its majority releases its level of a node hold its
// context carried, the caller's own Mutex hold; when that one release fails,
// only the RedLock's level goes: the caller's hold stays held and renewed
// until its own Unlock.
func TestRedLock_LostMajorityKeepsTheCallersOwnNodeHoldWhenItsReleaseFails(t *testing.T) {
	const timeout = 600 * time.Millisecond
	var own []*lock.Client
	var srvs []*testenv.RedisServer
	refuse := &refusedCalls{match: isRelease}
	for i := range 3 {
		srv := testenv.Redis(t)
		srvs = append(srvs, srv)
		rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
		if i == 2 {
			rdb.AddHook(refuse)
		}
		c := lock.New(rdb, lock.WithWatchdogTimeout(timeout))
		t.Cleanup(func() { c.Close() })
		own = append(own, c)
	}
	name := lockName(t)
	bg := context.Background()
	held, err := own[2].Mutex(name).Lock(bg) // the caller's own Mutex on node 2
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := lock.NewRedLock(name, own...).Lock(held)
	if err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(1) // the RedLock's release of its level on node 2 fails once
	srvs[0].Client().Del(bg, name)
	srvs[1].Client().Del(bg, name)
	select {
	case <-rctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the RedLock did not notice it lost its majority")
	}
	if !errors.Is(context.Cause(rctx), lock.ErrLost) {
		t.Fatalf("the RedLock ended with %v, want a loss", context.Cause(rctx))
	}
	time.Sleep(2 * timeout) // the caller's hold lives on only if it is renewed
	if held.Err() != nil {
		n, _ := srvs[2].Client().HGetAll(bg, name).Result()
		t.Fatalf("the caller's own Mutex hold on node 2 ended: %v (node 2 has %v)", context.Cause(held), n)
	}
	if n, err := srvs[2].Client().Exists(bg, name).Result(); err != nil || n != 1 {
		t.Fatalf("node 2's lock is gone (%v) while its owner's hold is live", err)
	}
	if err := own[2].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	if n, _ := srvs[2].Client().Exists(bg, name).Result(); n != 0 {
		t.Fatal("node 2's lock is still held after its owner's final Unlock")
	}
}

// A RedLock vote that re-enters a fixed node hold its context carries
// extends that node's lock to the RedLock's longer lease (a re-entry never
// weakens the hold); when the vote fails, the hold keeps that lease too, so
// that the lock is its owner's for as long as Redis keeps it, and is free
// for others once the hold ends.
func TestRedLock_FailedVoteLeavesNoCarriedLockHeldByNobody(t *testing.T) {
	const lease = 1200 * time.Millisecond
	var own, others []*lock.Client
	var srvs []*testenv.RedisServer
	for range 3 {
		srv := testenv.Redis(t)
		cs := instances(t, srv, 2)
		own, others, srvs = append(own, cs[0]), append(others, cs[1]), append(srvs, srv)
	}
	name := lockName(t)
	bg := context.Background()
	held, err := own[0].Mutex(name).Lock(bg, lock.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ { // the other nodes are someone else's: the vote fails
		if _, err := others[i].Mutex(name).Lock(bg); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := lock.NewRedLock(name, own...).TryLock(held, 0, lock.WithLease(lease)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("RedLock.TryLock: %v, want ErrNotAcquired", err)
	}
	select {
	case <-held.Done():
	case <-time.After(lease + 2*time.Second):
		t.Fatal("the Mutex hold outlived every lease it was given")
	}
	ended := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	pttl, _ := srvs[0].Client().PTTL(bg, name).Result()
	got, err := others[0].Mutex(name).TryLock(bg, 0)
	if err != nil {
		t.Fatalf("node 0's lock is held by nobody: its owner's hold ended after %v (%v) but another Client cannot take it: %v; PTTL %v",
			ended.Round(time.Millisecond), context.Cause(held), err, pttl)
	}
	_ = others[0].Mutex(name).Unlock(got)
}

// A MultiLock across slots re-enters a fixed hold its context carries with
// its longer lease in the first slot, and then fails on a later slot held
// by someone else: the rollback takes its level off, and the hold keeps the
// lease its lock was extended to, so that the lock is its owner's for as
// long as Redis keeps it, and is free for others once the hold ends.
func TestMultiLock_FailedAcquisitionAcrossSlotsLeavesNoCarriedLockHeldByNobody(t *testing.T) {
	const lease = 1200 * time.Millisecond
	env := testenv.Cluster(t, 3)
	rdb := env.Client()
	bg := context.Background()
	cs := make([]*lock.Client, 2)
	for i := range cs {
		c := lock.New(env.Client())
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	names := namesOnEveryMaster(t, rdb, lockName(t), 2)
	sort.Slice(names, func(i, j int) bool {
		return rdb.ClusterKeySlot(bg, names[i]).Val() < rdb.ClusterKeySlot(bg, names[j]).Val()
	})
	first, later := names[0], names[1] // taken in this order
	held, err := cs[0].Mutex(first).Lock(bg, lock.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].Mutex(later).Lock(bg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := cs[0].MultiLock(first, later).TryLock(held, 0, lock.WithLease(lease)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("MultiLock.TryLock: %v, want ErrNotAcquired", err)
	}
	select {
	case <-held.Done():
	case <-time.After(lease + 2*time.Second):
		t.Fatal("the Mutex hold outlived every lease it was given")
	}
	ended := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	pttl, _ := rdb.PTTL(bg, first).Result()
	got, err := cs[1].Mutex(first).TryLock(bg, 0)
	if err != nil {
		t.Fatalf("%s is held by nobody: its owner's hold ended after %v (%v) but another Client cannot take it: %v; PTTL %v",
			first, ended.Round(time.Millisecond), context.Cause(held), err, pttl)
	}
	_ = cs[1].Mutex(first).Unlock(got)
}
