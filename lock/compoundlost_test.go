package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// lostAndFreed waits for held, a compound lock's context, to end with a
// cause matching ErrLost, then checks that other takes the Mutex called
// name (a part that survived the loss) within a watchdog timeout, without
// the owner's Unlock, and that unlock then answers ErrLost.
func lostAndFreed(t *testing.T, held context.Context, other *lock.Client, name string, timeout time.Duration, unlock func(context.Context) error) {
	t.Helper()
	select {
	case <-held.Done():
	case <-time.After(5 * timeout):
		t.Fatal("the compound lock was not found lost")
	}
	if !errors.Is(context.Cause(held), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(held))
	}
	m := other.Mutex(name)
	got, err := m.TryLock(context.Background(), timeout)
	if err != nil {
		t.Fatalf("another Client, a watchdog timeout after the loss, before the owner's Unlock: %v (the part that survived is still held)", err)
	}
	if err := m.Unlock(got); err != nil {
		t.Fatal(err)
	}
	if err := unlock(held); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock after the loss = %v, want ErrLost", err)
	}
}

// A MultiLock one of whose locks is lost releases the others at once, as
// the end of its context would: they stop being renewed and are free for
// others before the caller's Unlock, which answers ErrLost.
func TestMultiLock_LostPartReleasesTheOthers(t *testing.T) {
	const timeout = 600 * time.Millisecond
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(timeout))
	name := lockName(t)
	ml := cs[0].MultiLock(name+":a", name+":b")
	held, err := ml.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Do("DEL", name+":a")
	lostAndFreed(t, held, cs[1], name+":b", timeout, ml.Unlock)
}

// A RedLock that lost its majority releases the nodes it holds still, as
// its final Unlock would: they stop being renewed and are free for others
// before the caller's Unlock, which answers ErrLost.
func TestRedLock_LostQuorumReleasesTheNodesLeft(t *testing.T) {
	const timeout = 600 * time.Millisecond
	name := lockName(t)
	var srvs []*testenv.RedisServer
	var own []*lock.Client
	var other *lock.Client
	for i := range 3 {
		srv := testenv.Redis(t)
		cs := instances(t, srv, 2, lock.WithWatchdogTimeout(timeout))
		srvs, own = append(srvs, srv), append(own, cs[0])
		if i == 2 {
			other = cs[1]
		}
	}
	r := lock.NewRedLock(name, own...)
	held, err := r.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Do("DEL", name)
	srvs[1].Do("DEL", name)
	lostAndFreed(t, held, other, name, timeout, r.Unlock)
}
