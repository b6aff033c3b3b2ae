package reliability

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// Redis stops answering for longer than a lease — CLIENT PAUSE (clients
// wait, keys do not expire meanwhile) or DEBUG SLEEP (the server itself
// blocks, and keys whose lease ran out expire once it wakes). The holder's
// renewals wait with everyone else's commands; it is told when its lease
// ends, by its own clock, before the waiter — whose acquisition waits in the
// same stall — gets in; its write is then refused, and the history is
// clean: no overlap at all. An acquisition that waited out the stall may
// come back after its own lease (measured from when it was sent) has run
// out: its hold is lost on arrival, and says so; the next attempt gets in.
func TestStall_RedisPausedOrAsleepPastTheLease(t *testing.T) {
	stalls := map[string]func(srv *testenv.RedisServer, d time.Duration){
		"CLIENT PAUSE": func(srv *testenv.RedisServer, d time.Duration) {
			srv.Do("CLIENT", "PAUSE", d.Milliseconds(), "ALL")
		},
		"DEBUG SLEEP": func(srv *testenv.RedisServer, d time.Duration) {
			go srv.Do("DEBUG", "SLEEP", d.Seconds()) // answers when the server wakes
		},
	}
	for name, stall := range stalls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const (
				key      = "sku:stall"
				watchdog = 900 * time.Millisecond
				pause    = 2 * time.Second
			)
			srv := testenv.Redis(t, "--enable-debug-command", "yes")
			db, _ := registers(t, key)
			rec := history.NewRecorder()
			a := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
			b := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
			actx, err := a.Mutex(key).Lock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			sa := enter(rec, "a", key, actx)
			if err := sa.Read(db); err != nil {
				t.Fatal(err)
			}
			stalled := history.Now()
			lostOnArrival := 0
			stall(srv, pause)

			type got struct {
				ctx context.Context
				err error
			}
			bgot := make(chan got, 1)
			go func() {
				ctx, err := b.Mutex(key).TryLock(context.Background(), 10*time.Second)
				bgot <- got{ctx, err}
			}()
			select {
			case <-actx.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the holder was never told")
			}
			if cause := context.Cause(actx); !errors.Is(cause, lock.ErrLost) {
				t.Fatalf("the holder's context ended with %v, want lock.ErrLost", cause)
			}
			eventually(t, time.Second, "the loss recorded", func() bool { return sa.lostAt.Load() != 0 })
			told := time.Unix(0, sa.lostAt.Load()).Sub(stalled)

			// The waiter's acquisition waited in the stall too; its lease is
			// measured from when it was sent, so a reply that came back after
			// (or just before) the lease ran out is a hold lost on arrival,
			// and its context says so. It tries again.
			g := <-bgot
			var sb *section
			for try := 0; ; try++ {
				if g.err != nil {
					t.Fatalf("the waiter after the stall: %v", g.err)
				}
				sb = enter(rec, "b", key, g.ctx)
				if sb.Token() <= sa.Token() {
					t.Fatalf("the waiter's token %d is not above the holder's %d", sb.Token(), sa.Token())
				}
				err := sb.Read(db)
				if err == nil {
					break
				}
				if !errors.Is(context.Cause(g.ctx), lock.ErrLost) || try == 3 {
					t.Fatalf("the waiter's read: %v (its context: %v)", err, context.Cause(g.ctx))
				}
				lostOnArrival++
				sb.Leave()
				_ = b.Mutex(key).Unlock(g.ctx)
				ctx, err := b.Mutex(key).TryLock(context.Background(), 10*time.Second)
				g = got{ctx, err}
			}
			bIn := sb.hold.Enter.Sub(stalled)
			if _, err := sb.Write(db, true); err != nil {
				t.Fatalf("the waiter's write: %v", err)
			}
			sb.Leave()
			_ = b.Mutex(key).Unlock(g.ctx)
			if w, err := sa.Write(db, true); w.Accepted || !errors.Is(err, fencing.ErrStale) {
				t.Fatalf("the stalled holder's write: %v, want refused as stale", err)
			}
			sa.Leave()
			r := check(t, rec, db)
			t.Logf("%s for %v: the holder was told after %v, the waiter got in after %v (%d holds lost on arrival first); %s", name, pause, told.Round(time.Millisecond), bIn.Round(time.Millisecond), lostOnArrival, r)
			if bIn < told {
				t.Errorf("the waiter got in %v before the holder was told", told-bIn)
			}
			if !r.OK() || r.Unprotected != 0 {
				t.Fatalf("history: %s", r)
			}
		})
	}
}
