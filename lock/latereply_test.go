package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// An acquisition whose reply arrives after the lease it set has run out,
// counted from when it was sent, is not a success: the key may be gone, or
// someone else's. TryLock reports it within its wait, and leaves nothing
// behind; Lock tries again until it gets a reply in time.

// lateReplyLatency is added each way by the proxy: a round trip of 500ms,
// longer than the 400ms leases below.
const lateReplyLatency = 250 * time.Millisecond

// notAcquiredOrLost reports whether err is how a late reply is refused.
func notAcquiredOrLost(err error) bool {
	return errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrLost)
}

func TestAcquire_ReplyAfterItsLeaseIsNotASuccess(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []lock.Option
		lo   []lock.LockOption
	}{
		{"fixed lease", nil, []lock.LockOption{lock.WithLease(400 * time.Millisecond)}},
		{"watchdog", []lock.Option{lock.WithWatchdogTimeout(400 * time.Millisecond)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.Redis(t)
			direct := srv.Client()
			p, rdb := proxied(t, srv)
			c := lock.New(rdb, tc.opts...)
			defer c.Close()
			name := lockName(t)
			m := c.Mutex(name)
			bg := context.Background()
			// A connection and the scripts ready, as on a Client in use:
			// the attempts below each take one round trip.
			warm, err := m.Lock(bg, tc.lo...)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Unlock(warm); err != nil {
				t.Fatal(err)
			}
			p.SetLatency(lateReplyLatency)

			const wait = time.Second
			start := time.Now()
			ctx, err := m.TryLock(bg, wait, tc.lo...)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("TryLock over a link slower than the lease succeeded after %v; its context: %v, the key in Redis: %d",
					took.Round(time.Millisecond), context.Cause(ctx), direct.Exists(bg, name).Val())
			}
			if !notAcquiredOrLost(err) {
				t.Fatalf("TryLock = %v, want ErrNotAcquired or ErrLost", err)
			}
			// Its wait, and the one attempt and undo under way when it ran out.
			if took > wait+4*lateReplyLatency+500*time.Millisecond {
				t.Fatalf("TryLock took %v, for a wait of %v", took, wait)
			}
			eventually(t, time.Second, "nothing left in Redis", func() bool {
				return direct.Exists(bg, name).Val() == 0
			})

			// Lock keeps trying, and gets the lock once a reply comes in time.
			type result struct {
				ctx context.Context
				err error
				at  time.Time
			}
			got := make(chan result, 1)
			go func() {
				ctx, err := m.Lock(bg, tc.lo...)
				got <- result{ctx, err, time.Now()}
			}()
			select {
			case r := <-got:
				t.Fatalf("Lock over a link slower than the lease returned %v (context: %v)", r.err, context.Cause(r.ctx))
			case <-time.After(3 * lateReplyLatency * 2):
			}
			p.SetLatency(0)
			var r result
			select {
			case r = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("Lock did not get the lock once the link was fast again")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.ctx.Err() != nil {
				t.Fatalf("Lock returned an ended hold %v after it returned: %v", time.Since(r.at), context.Cause(r.ctx))
			}
			if direct.Exists(bg, name).Val() != 1 {
				t.Fatal("Lock returned a hold that Redis does not have")
			}
			if err := m.Unlock(r.ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every single-key kind refuses a reply that came after its lease.
func TestAcquire_ReplyAfterItsLeaseIsRefusedByEveryKind(t *testing.T) {
	srv := testenv.Redis(t)
	direct := srv.Client()
	p, rdb := proxied(t, srv)
	c := lock.New(rdb)
	defer c.Close()
	bg := context.Background()
	// A round trip of 120ms, over leases of 100ms.
	lease := lock.WithLease(100 * time.Millisecond)
	name := lockName(t)
	p.SetLatency(60 * time.Millisecond)
	for _, tc := range []struct {
		kind string
		key  string
		try  func() (context.Context, error)
	}{
		{"Mutex", name + ":m", func() (context.Context, error) { return c.Mutex(name+":m").TryLock(bg, 0, lease) }},
		{"FairMutex", name + ":f", func() (context.Context, error) { return c.FairMutex(name+":f").TryLock(bg, 0, lease) }},
		{"RWMutex write", name + ":w", func() (context.Context, error) { return c.RWMutex(name+":w").TryLock(bg, 0, lease) }},
		{"RWMutex read", name + ":r", func() (context.Context, error) { return c.RWMutex(name+":r").TryRLock(bg, 0, lease) }},
		{"Semaphore", name + ":s", func() (context.Context, error) { return c.Semaphore(name+":s", 2).TryAcquire(bg, 0, lease) }},
	} {
		ctx, err := tc.try()
		if err == nil {
			t.Errorf("%s: a reply after the lease was a success; its context: %v", tc.kind, context.Cause(ctx))
			continue
		}
		if !notAcquiredOrLost(err) {
			t.Errorf("%s: %v, want ErrNotAcquired or ErrLost", tc.kind, err)
		}
		if tc.kind == "Semaphore" {
			// The count of free permits stays (with an idle expiry): no
			// permit may.
			if m := direct.ZCard(bg, permitsKey(tc.key)).Val(); m != 0 {
				t.Errorf("%s: %d permits left behind in Redis", tc.kind, m)
			}
		} else if n := direct.Exists(bg, tc.key).Val(); n != 0 {
			t.Errorf("%s: left behind in Redis: %v", tc.kind, direct.Do(bg, "TYPE", tc.key).Val())
		}
	}
}
