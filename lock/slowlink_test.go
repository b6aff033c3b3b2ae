package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// cutAfterReply is a go-redis hook that cuts its proxy off (a blackhole:
// nothing gets through either way) as soon as the first pipelined round
// trip after it was armed has its replies: the watchdog's renewal, which
// reached Redis and whose answer the holder read.
type cutAfterReply struct {
	p     *faults.Proxy
	armed atomic.Bool
	cut   chan time.Time
}

func (h *cutAfterReply) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *cutAfterReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *cutAfterReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && h.armed.CompareAndSwap(true, false) {
			h.p.SetBlackhole(true)
			h.cut <- time.Now()
		}
		return err
	}
}

// A renewed lease counts from when the renewal was sent, not from its
// reply. Over a link with 300ms of latency each way, Redis extends the lock
// when the renewal arrives, 300ms after it was sent, and the holder reads
// the reply 300ms later still: counted from the reply, the holder would
// believe in its lock 300ms longer than Redis keeps it. Cut off right after
// such a renewal, the holder must be told before another Client gets in.
func TestWatchdog_RenewedLeaseCountsFromWhenTheRenewalWasSent(t *testing.T) {
	const (
		// Renewals every 667ms, each a 600ms round trip: one renewal's
		// reply comes well within the lease its predecessor set.
		timeout = 2 * time.Second
		latency = 300 * time.Millisecond
	)
	srv := testenv.Redis(t)
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	hook := &cutAfterReply{p: p, cut: make(chan time.Time, 1)}
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer rdb.Close()
	rdb.AddHook(hook)
	holder := lock.New(rdb, lock.WithWatchdogTimeout(timeout))
	defer holder.Close()
	other := instances(t, srv, 1, lock.WithWatchdogTimeout(timeout))[0]
	name := lockName(t)
	bg := context.Background()

	ctx, err := holder.Mutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	// A renewal loads the script first, on a fast link; from then on
	// every renewal takes a slow round trip.
	time.Sleep(timeout / 2)
	p.SetLatency(latency)
	time.Sleep(timeout / 2)
	hook.armed.Store(true)
	var cut time.Time
	select {
	case cut = <-hook.cut:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal within 5s")
	}
	if ctx.Err() != nil {
		t.Fatalf("the hold ended before the cut: %v", context.Cause(ctx))
	}
	octx, err := other.Mutex(name).TryLock(bg, 5*time.Second)
	if err != nil {
		t.Fatalf("the other Client never got the lock of the cut-off holder: %v", err)
	}
	in := time.Since(cut)
	defer other.Mutex(name).Unlock(octx)
	t.Logf("the other Client got in %v after the cut", in.Round(time.Millisecond))
	if ctx.Err() == nil {
		select {
		case <-ctx.Done():
			t.Fatalf("the cut-off holder was told %v after the cut, after the other Client got in at %v: its lease was counted from the renewal's reply",
				time.Since(cut).Round(time.Millisecond), in.Round(time.Millisecond))
		case <-time.After(5 * time.Second):
			t.Fatal("the cut-off holder was never told")
		}
	}
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(ctx))
	}
}
