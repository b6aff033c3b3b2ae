package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A MultiLock taken with a context that holds several of its names adds a
// level to each of those holds; when the MultiLock's own context ends, every
// one of those levels goes with it, so that the holders' Unlocks release the
// locks in the end and nothing is left in Redis or in the Client.
func TestReentry_MultiLockOverHeldMutexReleasesEveryLevel(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	a, b, d := c.Mutex(name+":a"), c.Mutex(name+":b"), c.Mutex(name+":c")
	bg := context.Background()
	ctxA, err := a.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	ctxB, err := b.Lock(ctxA)
	if err != nil {
		t.Fatal(err)
	}
	ctxD, err := d.Lock(ctxB)
	if err != nil {
		t.Fatal(err)
	}
	call, cancel := context.WithCancel(ctxD)
	ml := c.MultiLock(name+":a", name+":b", name+":c")
	mctx, err := ml.Lock(call)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*lock.Mutex{a, b, d} {
		if n, err := m.HoldCount(mctx); n != 2 || err != nil {
			t.Fatalf("%s under the MultiLock: HoldCount %d, %v; want 2", m.Name(), n, err)
		}
	}
	cancel() // the MultiLock's context ends: its levels go
	eventually(t, 2*time.Second, "the MultiLock's context ended", func() bool { return mctx.Err() != nil })
	deadline := time.Now().Add(2 * time.Second)
	for _, m := range []*lock.Mutex{a, b, d} {
		for {
			n, err := m.HoldCount(ctxD)
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: HoldCount %d, %v 2s after the MultiLock's context ended; want 1 (the MultiLock's level released)", m.Name(), n, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := ml.Unlock(mctx); err != nil {
		t.Fatalf("MultiLock Unlock after its context ended: %v; want nil", err)
	}
	for _, step := range []struct {
		m   *lock.Mutex
		ctx context.Context
	}{{d, ctxD}, {b, ctxB}, {a, ctxA}} {
		if err := step.m.Unlock(step.ctx); err != nil {
			t.Fatalf("%s: Unlock: %v", step.m.Name(), err)
		}
		if n, err := step.m.HoldCount(step.ctx); n != 0 || err != nil {
			t.Fatalf("%s: HoldCount after its final Unlock = %d, %v; want 0", step.m.Name(), n, err)
		}
		if ok, err := step.m.IsLocked(bg); ok || err != nil {
			t.Fatalf("%s: still locked after its final Unlock (%v)", step.m.Name(), err)
		}
	}
	eventually(t, time.Second, "the Client forgets every hold", func() bool { return lock.HoldsOf(c) == 0 })
}
