package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A hold the watchdog finds gone is over: its context ends with ErrLost,
// Unlock answers ErrLost, nothing renews it any more, and the next Lock with
// the context it was taken with is an acquisition of its own, with a larger
// token, renewed again.
func TestLoss_AHoldFoundGoneEndsAndTheNextLockIsFresh(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	renewals, renew := testenv.NewCommandCounter(), lock.RenewScriptSHA()
	rdb.AddHook(renewals)
	const timeout = 600 * time.Millisecond // renewals every 200 ms
	c := lock.New(rdb, lock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { c.Close() })
	name := lockName(t)
	m := c.Mutex(name)
	req, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx1, err := m.Lock(req)
	if err != nil {
		t.Fatal(err)
	}
	tok1, _ := fencing.FromContext(ctx1)
	if err := srv.Client().Del(req, name).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx1.Done():
	case <-time.After(2 * timeout):
		t.Fatal("the hold's context did not end within two leases of its lock being deleted")
	}
	if cause := context.Cause(ctx1); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the lost hold's context ended with %v; want ErrLost", cause)
	}
	if err := m.Unlock(ctx1); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock of the lost hold = %v; want ErrLost", err)
	}
	if n, err := m.HoldCount(ctx1); n != 0 || err != nil {
		t.Fatalf("HoldCount of the lost hold = %d, %v; want 0", n, err)
	}
	before := renewals.Script(renew)
	time.Sleep(3 * timeout / 3) // three renewal periods
	if n := renewals.Script(renew) - before; n != 0 {
		t.Fatalf("%d renewals sent in the three periods after the hold was lost; want none", n)
	}
	if n := lock.HoldsOf(c); n != 0 {
		t.Fatalf("the Client keeps %d hold(s) after the loss: %v", n, lock.DescribeHolds(c))
	}

	ctx2, err := m.TryLock(req, 0)
	if err != nil {
		t.Fatalf("Lock with the lost hold's own request context: %v", err)
	}
	tok2, _ := fencing.FromContext(ctx2)
	if tok2 <= tok1 {
		t.Fatalf("the new hold's token %d is not above the lost one's %d", tok2, tok1)
	}
	if n, err := m.HoldCount(ctx2); n != 1 || err != nil {
		t.Fatalf("HoldCount of the new hold = %d, %v; want 1 (a fresh hold, not a re-entry of the lost one)", n, err)
	}
	before = renewals.Script(renew)
	time.Sleep(timeout)
	if renewals.Script(renew) == before || ctx2.Err() != nil {
		t.Fatalf("the new hold is not renewed (renewals %d, context %v)", renewals.Script(renew)-before, context.Cause(ctx2))
	}
	if err := m.Unlock(ctx2); err != nil {
		t.Fatal(err)
	}
}

// A hold declared lost at its lease end (its renewals did not get through)
// is rolled back in Redis in the background. When that rollback arrives
// after the owner has locked again with the same request context, it
// removes nothing of the new hold: a release only ever removes the hold it
// was sent for.
func TestLoss_TheRollbackAfterALeaseEndLeavesTheNextHoldAlone(t *testing.T) {
	srv := testenv.Redis(t)
	p, rdb := proxied(t, srv)
	const timeout = 900 * time.Millisecond
	c := lock.New(rdb, lock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { c.Close() })
	other := lock.New(srv.Client())
	t.Cleanup(func() { other.Close() })
	name := lockName(t)
	m := c.Mutex(name)
	direct := srv.Client()
	bg := context.Background()
	req, cancel := context.WithCancel(bg)
	defer cancel()
	ctx1, err := m.Lock(req)
	if err != nil {
		t.Fatal(err)
	}
	tok1, _ := fencing.FromContext(ctx1)

	p.SetBlackhole(true) // no renewal gets through: the hold is lost at its lease end
	select {
	case <-ctx1.Done():
	case <-time.After(2 * timeout):
		p.SetBlackhole(false)
		t.Fatal("the hold was not declared lost by its lease end")
	}
	// Its rollback is on its way, held in the blackhole. Let the lock
	// expire in Redis, then hold that rollback back until the owner has
	// locked again.
	eventually(t, timeout, "the lost lock expires in Redis", func() bool {
		n, err := direct.Exists(bg, name).Result()
		return err == nil && n == 0
	})
	arrived, deliver := make(chan struct{}), make(chan struct{})
	delivered := p.LoseReplyTo(faults.Containing([]byte(lock.ReleaseScriptSHA())), func() {
		close(arrived)
		<-deliver
	})
	p.SetBlackhole(false)
	select {
	case <-arrived:
	case <-time.After(time.Second):
		t.Fatal("the lost hold's rollback never reached Redis")
	}
	ctx2, err := m.TryLock(req, time.Second)
	close(deliver)
	if err != nil {
		t.Fatalf("Lock with the lost hold's request context: %v", err)
	}
	<-delivered                       // the rollback reached Redis (its reply, or one before it, is lost)
	time.Sleep(50 * time.Millisecond) // and has run
	tok2, _ := fencing.FromContext(ctx2)
	if tok2 <= tok1 {
		t.Fatalf("the new hold's token %d is not above the lost one's %d", tok2, tok1)
	}
	if n, err := m.HoldCount(ctx2); n != 1 || err != nil {
		t.Fatalf("after the late rollback of the lost hold, the new hold's HoldCount = %d, %v; want 1", n, err)
	}
	if octx, err := other.Mutex(name).TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		if err == nil {
			_ = other.Mutex(name).Unlock(octx)
		}
		t.Fatalf("another Client's TryLock beside the new hold = %v; want ErrNotAcquired", err)
	}
	time.Sleep(timeout / 2)
	if ctx2.Err() != nil {
		t.Fatalf("the new hold ended: %v", context.Cause(ctx2))
	}
	if err := m.Unlock(ctx2); err != nil {
		t.Fatal(err)
	}
}
