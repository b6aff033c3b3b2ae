package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

func TestSemaphore_NeverAdmitsMoreThanItsPermits(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	const permits = 3
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for _, c := range clients {
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := c.Semaphore(name, permits)
				for r := 0; r < 6; r++ {
					ctx, err := s.Acquire(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					if err := s.Release(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if m := most.Load(); m > permits {
		t.Fatalf("%d holders at once, want at most %d", m, permits)
	} else if m < 2 {
		t.Fatalf("at most %d holder at once: permits are not shared", m)
	}
	t.Logf("up to %d holders at once (permits %d)", most.Load(), permits)
	if n := srv.Do("EXISTS", permitsKey(name)); n != int64(0) {
		t.Fatalf("permits left behind after every holder released")
	}
	if free := srv.Do("GET", name); free != "3" {
		t.Fatalf("free permits after every release: %v, want 3", free)
	}
}

// permitsKey is the key of a Semaphore's permits handed out, as Redisson's
// RPermitExpirableSemaphore names it.
func permitsKey(name string) string {
	if strings.Contains(name, "{") {
		return name + ":timeout"
	}
	return "{" + name + "}:timeout"
}

func TestSemaphore_ReleaseWakesAWaiterAtOnce(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2) // 30s leases: only the release can explain a quick wake-up
	name := lockName(t)
	held, err := cs[0].Semaphore(name, 1).Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		ctx, err := cs[1].Semaphore(name, 1).Acquire(context.Background())
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		cs[1].Semaphore(name, 1).Release(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	cs[0].Semaphore(name, 1).Release(held)
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	if d := at.Sub(released); d > 200*time.Millisecond {
		t.Fatalf("waiter got the permit %v after the release", d)
	}
}

func TestSemaphore_DeadHoldersPermitsReturnAfterTheirLease(t *testing.T) {
	srv := testenv.Redis(t)
	opt := lock.WithWatchdogTimeout(time.Second)
	dying := instances(t, srv, 1, opt)[0]
	alive := instances(t, srv, 1, opt)[0]
	name := lockName(t)
	for i := 0; i < 2; i++ {
		if _, err := dying.Semaphore(name, 2).Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// A live holder keeps its permit well past the watchdog timeout.
	time.Sleep(2200 * time.Millisecond)
	if _, err := alive.Semaphore(name, 2).TryAcquire(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("got a permit while both were held and renewed: %v", err)
	}
	died := time.Now()
	dying.Close()
	ctx, err := alive.Semaphore(name, 2).TryAcquire(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(died); d > 2500*time.Millisecond {
		t.Fatalf("permit returned %v after its holder died, want about the 1s lease", d)
	}
	alive.Semaphore(name, 2).Release(ctx)
}

func TestSemaphore_ReentryTakesNoSecondPermit(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	s := cs[0].Semaphore(name, 2)
	outer, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fencing.FromContext(outer); ok {
		t.Fatal("a permit carries a token")
	}
	inner, err := s.TryAcquire(outer, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.Do("ZCARD", permitsKey(name)); n != int64(1) {
		t.Fatalf("%v permits taken by one owner, want 1", n)
	}
	other, err := cs[1].Semaphore(name, 2).TryAcquire(context.Background(), 0)
	if err != nil {
		t.Fatalf("second permit: %v", err)
	}
	if err := s.Release(inner); err != nil {
		t.Fatal(err)
	}
	if n := srv.Do("ZCARD", permitsKey(name)); n != int64(2) {
		t.Fatalf("inner release gave the permit back (%v taken)", n)
	}
	if err := s.Release(outer); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(outer); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release without a permit = %v, want ErrNotHeld", err)
	}
	cs[1].Semaphore(name, 2).Release(other)
}

func TestSemaphore_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	var nilSem *lock.Semaphore
	cases := map[string]func() error{
		"zero permits":     func() error { _, err := c.Semaphore("x", 0).Acquire(bg); return err },
		"negative permits": func() error { _, err := c.Semaphore("x", -3).TryAcquire(bg, 0); return err },
		"empty name":       func() error { _, err := c.Semaphore("", 1).Acquire(bg); return err },
		"negative wait":    func() error { _, err := c.Semaphore("x", 1).TryAcquire(bg, -1); return err },
		"zero lease":       func() error { _, err := c.Semaphore("x", 1).Acquire(bg, lock.WithLease(0)); return err },
		"nil context":      func() error { _, err := c.Semaphore("x", 1).Acquire(nil); return err }, //nolint:staticcheck
		"nil semaphore":    func() error { _, err := nilSem.Acquire(bg); return err },
		"nil lock client":  func() error { var nc *lock.Client; _, err := nc.Semaphore("x", 1).Acquire(bg); return err },
		"release bad":      func() error { return c.Semaphore("x", 0).Release(bg) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if n := srv.Do("DBSIZE"); n != int64(0) {
		t.Fatalf("bad input created %v keys", n)
	}
}
