package reliability

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// leakOptions are the goroutines a scenario may leave that are not its
// own: the goroutine waiting for a redis-server restarted by the test.
var leakOptions = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/seckillguard/seckillguard/internal/testkit/testenv.(*RedisServer).start.func1"),
}

// Redis restarted without persistence while locks are held and others wait:
// the holders are told within one renewal period that their locks are gone,
// their writes from then on are refused, the waiters get the locks on the
// empty server with tokens newer than every earlier one, and once every
// Client is closed no goroutine is left.
func TestRestart_HoldersLearnWithinARenewalAndWaitersRecover(t *testing.T) {
	const (
		keys     = 3
		waiters  = 2 // per key
		watchdog = 900 * time.Millisecond
		period   = watchdog / 3
	)
	srv := testenv.Redis(t)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("sku:restart-%d", i)
	}
	db, _ := registers(t, names...)
	defer goleak.VerifyNone(t, append(leakOptions, goleak.IgnoreCurrent())...)
	rec := history.NewRecorder()
	var clients []*lock.Client
	newClient := func() *lock.Client {
		c := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
		clients = append(clients, c)
		return c
	}

	// One holder per key, each in a Client of its own, reads the register.
	type holder struct {
		s   *section
		ctx context.Context
	}
	holders := make([]holder, keys)
	for i, name := range names {
		ctx, err := newClient().Mutex(name).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		holders[i] = holder{enter(rec, fmt.Sprintf("holder-%d", i), name, ctx), ctx}
		if err := holders[i].s.Read(db); err != nil {
			t.Fatal(err)
		}
	}
	// Waiters queue behind them, each in a Client of its own, and each
	// increments its register once it gets in.
	var wg sync.WaitGroup
	errs := make(chan error, keys*waiters)
	for i, name := range names {
		for w := range waiters {
			c := newClient()
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				m := c.Mutex(name)
				lctx, err := m.Lock(ctx)
				if err != nil {
					errs <- fmt.Errorf("waiter %d of %s: %w", w, name, err)
					return
				}
				s := enter(rec, fmt.Sprintf("waiter-%d-%d", i, w), name, lctx)
				if err := s.Read(db); err == nil {
					_, err = s.Write(db, true)
					if err != nil {
						errs <- fmt.Errorf("waiter %d of %s: write: %w", w, name, err)
					}
				}
				s.Leave()
				if err := m.Unlock(lctx); err != nil {
					errs <- fmt.Errorf("waiter %d of %s: unlock: %w", w, name, err)
				}
			}()
		}
	}
	eventually(t, 5*time.Second, "every waiter subscribed", func() bool {
		n := 0
		for _, name := range names {
			v := srv.Do("PUBSUB", "NUMSUB", "redisson_lock__channel:{"+name+"}").([]any)
			if v[1].(int64) > 0 {
				n++
			}
		}
		return n == keys
	})

	srv.Restart()
	up := history.Now()

	for i, h := range holders {
		select {
		case <-h.ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("holder %d was not told its lock vanished with the restart", i)
		}
		if cause := context.Cause(h.ctx); !errors.Is(cause, lock.ErrLost) {
			t.Fatalf("holder %d: context ended with %v, want lock.ErrLost", i, cause)
		}
		eventually(t, time.Second, "the loss recorded", func() bool { return h.s.lostAt.Load() != 0 })
		told := time.Unix(0, h.s.lostAt.Load())
		if d := told.Sub(up); d > period+200*time.Millisecond {
			t.Errorf("holder %d was told %v after the server was back; the watchdog renews every %v", i, d, period)
		} else {
			t.Logf("holder %d told %v after the server was back (renewal period %v)", i, d.Round(time.Millisecond), period)
		}
		// Told, it writes anyway: refused before anything is sent.
		if w, err := h.s.Write(db, true); err == nil || w.Accepted {
			t.Errorf("holder %d wrote after it was told: %v", i, err)
		}
		h.s.Leave()
		if err := clients[i].Mutex(names[i]).Unlock(h.ctx); !errors.Is(err, lock.ErrLost) {
			t.Errorf("holder %d: Unlock = %v, want lock.ErrLost", i, err)
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("waiters did not all get their locks after the restart")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("all waiters served %v after the restart", history.Now().Sub(up).Round(time.Millisecond))

	for _, c := range clients {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
	r := check(t, rec, db)
	closeDB(t, db) // its connections are not the lock's to leak
	t.Logf("%s", r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
	if s := r.Summary; s.Accepted != keys*waiters || s.Rejected != keys || s.RejectedOfLost != keys {
		t.Fatalf("history: %s", r)
	}
}
