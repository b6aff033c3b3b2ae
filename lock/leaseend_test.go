package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A hold left to its fixed lease (WithLease, never unlocked, as redislock's
// users do) is over when the lease runs out: the Client forgets it then,
// rather than keep it registered as held for as long as it lives, and a
// later Unlock answers ErrLost. Also when a re-entry extended the lease.
func TestLease_AHoldLeftToItsLeaseIsForgottenWhenItRunsOut(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	bg := context.Background()
	const lease = 100 * time.Millisecond
	for _, reentry := range []bool{false, true} {
		var ctx context.Context
		var err error
		if reentry {
			if ctx, err = m.Lock(bg, lock.WithLease(lease/2)); err == nil {
				ctx, err = m.Lock(ctx, lock.WithLease(lease))
			}
		} else {
			ctx, err = m.Lock(bg, lock.WithLease(lease))
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			t.Fatal("the hold's context outlived its lease")
		}
		eventually(t, time.Second, "the Client forgets the hold whose lease ran out", func() bool { return lock.HoldsOf(c) == 0 })
		if err := m.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("Unlock after the lease ran out = %v; want ErrLost", err)
		}
		if n, err := m.HoldCount(ctx); n != 0 || err != nil {
			t.Fatalf("HoldCount after the lease ran out = %d, %v; want 0", n, err)
		}
		eventually(t, time.Second, "the lock expires in Redis", func() bool { return srv.Do("EXISTS", m.Name()) == int64(0) })
	}
}
