package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

func TestRWMutex_ReadersShareWritersExcludeAcrossClients(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	var readers, writers, violations, maxReaders atomic.Int32
	var wg sync.WaitGroup
	for i, c := range clients {
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rw := c.RWMutex(name)
				for r := 0; r < 8; r++ {
					if (i+g+r)%4 == 0 {
						ctx, err := rw.Lock(context.Background())
						if err != nil {
							t.Error(err)
							return
						}
						if writers.Add(1) != 1 || readers.Load() != 0 {
							violations.Add(1)
						}
						time.Sleep(200 * time.Microsecond)
						writers.Add(-1)
						if err := rw.Unlock(ctx); err != nil {
							t.Error(err)
						}
						continue
					}
					ctx, err := rw.RLock(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					n := readers.Add(1)
					if writers.Load() != 0 {
						violations.Add(1)
					}
					for m := maxReaders.Load(); n > m && !maxReaders.CompareAndSwap(m, n); m = maxReaders.Load() {
					}
					time.Sleep(time.Millisecond)
					readers.Add(-1)
					if err := rw.RUnlock(ctx); err != nil {
						t.Error(err)
					}
				}
			}()
		}
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d times a writer overlapped another holder", v)
	}
	if maxReaders.Load() < 2 {
		t.Fatalf("readers never overlapped (max %d at once): reads are not shared", maxReaders.Load())
	}
	t.Logf("up to %d readers at once", maxReaders.Load())
	if n := srv.Do("EXISTS", name); n != int64(0) {
		t.Fatal("lock left behind")
	}
}

func TestRWMutex_WriterIsNotStarvedByAStreamOfReaders(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	stop := make(chan struct{})
	var afterWriter atomic.Int32 // first read holds granted while the writer holds
	var writing atomic.Bool
	var wg sync.WaitGroup
	// Three Clients read in overlapping 30ms holds, so the lock is never
	// free of readers: without writer preference the writer would wait
	// forever.
	for _, c := range clients[:3] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rw := c.RWMutex(name)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, err := rw.RLock(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if writing.Load() {
					afterWriter.Add(1)
				}
				time.Sleep(30 * time.Millisecond)
				rw.RUnlock(ctx)
			}
		}()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	ctx, err := clients[3].RWMutex(name).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("writer: %v", err)
	}
	writing.Store(true)
	waited := time.Since(start)
	time.Sleep(50 * time.Millisecond)
	writing.Store(false)
	clients[3].RWMutex(name).Unlock(ctx)
	close(stop)
	wg.Wait()
	t.Logf("writer waited %v for a stream of readers", waited)
	if waited > 2*time.Second {
		t.Fatalf("writer waited %v: readers kept coming in ahead of it", waited)
	}
	if n := afterWriter.Load(); n != 0 {
		t.Fatalf("%d readers got in while the writer held the lock", n)
	}
}

func TestRWMutex_ReentryDowngradeAndUpgrade(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	rw := cs[0].RWMutex(name)
	other := cs[1].RWMutex(name)
	bg := context.Background()

	w1, err := rw.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := fencing.FromContext(w1)
	if !ok {
		t.Fatal("write hold without a token")
	}
	w2, err := rw.Lock(w1) // re-entry
	if err != nil {
		t.Fatal(err)
	}
	r1, err := rw.RLock(w2) // downgrade: read under the write lock
	if err != nil {
		t.Fatalf("writer taking the read lock: %v", err)
	}
	if rt, ok := fencing.FromContext(r1); ok {
		t.Fatalf("read context carries token %d: readers must not write", rt)
	}
	if _, err := other.TryRLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another reader got in while the write lock is held: %v", err)
	}
	// The read hold's context descends from the context the write lock was
	// taken with, not from the write lock's: asking it for the write lock
	// is an upgrade. The write lock's own contexts re-enter it.
	if _, err := rw.TryLock(r1, 0); !errors.Is(err, lock.ErrUpgrade) {
		t.Fatalf("write lock from the downgraded context = %v, want ErrUpgrade", err)
	}
	w3, err := rw.Lock(w2)
	if err != nil {
		t.Fatalf("write re-entry under the downgrade: %v", err)
	}
	for _, c := range []context.Context{w3, w2, w1} {
		if err := rw.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	if r1.Err() != nil {
		t.Fatalf("the downgraded read context ended with the write lock: %v", context.Cause(r1))
	}
	// Only the read hold is left: other readers join, writers wait.
	or, err := other.TryRLock(bg, time.Second)
	if err != nil {
		t.Fatalf("reader after the downgrade: %v", err)
	}
	if _, err := other.TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("writer got in past the read holds: %v", err)
	}
	// Read -> write upgrade is refused, not a deadlock.
	start := time.Now()
	if _, err := rw.Lock(r1); !errors.Is(err, lock.ErrUpgrade) {
		t.Fatalf("upgrade = %v, want ErrUpgrade", err)
	}
	if _, err := other.Lock(or); !errors.Is(err, lock.ErrUpgrade) {
		t.Fatalf("upgrade by another Client = %v, want ErrUpgrade", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("upgrade refused after %v", d)
	}
	r2, err := rw.RLock(r1) // read re-entry
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []context.Context{r2, r1} {
		if err := rw.RUnlock(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.RUnlock(or); err != nil {
		t.Fatal(err)
	}
	w, err := other.TryLock(bg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if t2, _ := fencing.FromContext(w); t2 <= tok {
		t.Fatalf("next write token %d not above %d", t2, tok)
	}
	other.Unlock(w)
	if n := srv.Do("EXISTS", name, "seckillguard_rwlock_readers:{"+name+"}"); n != int64(0) {
		t.Fatalf("%v keys left behind", n)
	}
}

func TestRWMutex_ReadHoldsCarryNoTokenOfTheirOwn(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	ctx, err := c.RWMutex(lockName(t)).RLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tok, ok := fencing.FromContext(ctx); ok {
		t.Fatalf("read hold carries token %d", tok)
	}
	c.RWMutex(lockName(t)).RUnlock(ctx)
}

func TestRWMutex_CrashedReaderDropsOutWhileOthersRead(t *testing.T) {
	srv := testenv.Redis(t)
	opt := lock.WithWatchdogTimeout(time.Second)
	crashed := instances(t, srv, 1, opt)[0]
	alive := instances(t, srv, 2, opt)
	name := lockName(t)
	if _, err := crashed.RWMutex(name).RLock(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := alive[0].RWMutex(name).RLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	crashed.Close() // dies holding its read lock
	crashedAt := time.Now()
	got := make(chan time.Time, 1)
	go func() {
		w, err := alive[1].RWMutex(name).TryLock(context.Background(), 5*time.Second)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		alive[1].RWMutex(name).Unlock(w)
	}()
	// The live reader keeps reading, renewed, well past the crashed one's
	// lease; the crashed reader's field must be gone by then.
	time.Sleep(2500 * time.Millisecond)
	if fields := srv.Do("HLEN", name); fields != int64(2) { // mode + the live reader
		t.Fatalf("lock hash has %v fields 2.5s after a reader crashed, want 2 (mode, live reader): %v",
			fields, srv.Do("HGETALL", name))
	}
	select {
	case <-got:
		t.Fatal("writer got in while a live reader held the lock")
	default:
	}
	released := time.Now()
	alive[0].RWMutex(name).RUnlock(r)
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	if d := at.Sub(released); d > time.Second {
		t.Fatalf("writer got in %v after the last live reader left (crashed %v before)", d, released.Sub(crashedAt))
	}
}

func TestRWMutex_CrashedWriterLockIsTakenAfterTheLease(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(time.Second))
	name := lockName(t)
	if _, err := cs[0].RWMutex(name).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	cs[0].Close()
	ctx, err := cs[1].RWMutex(name).TryRLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(crashed); d > 2500*time.Millisecond {
		t.Fatalf("read %v after the writer crashed, want about its 1s lease", d)
	}
	cs[1].RWMutex(name).RUnlock(ctx)
}

func TestRWMutex_WriterThatGivesUpLetsReadersIn(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3)
	name := lockName(t)
	r, err := cs[0].RWMutex(name).RLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].RWMutex(name).RUnlock(r)
	readerIn := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // arrive while the writer waits
		ctx, err := cs[2].RWMutex(name).TryRLock(context.Background(), 5*time.Second)
		if err == nil {
			cs[2].RWMutex(name).RUnlock(ctx)
		}
		readerIn <- err
	}()
	start := time.Now()
	if _, err := cs[1].RWMutex(name).TryLock(context.Background(), 300*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("writer TryLock = %v, want ErrNotAcquired", err)
	}
	if err := <-readerIn; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("reader got in %v after the writer started waiting, want soon after it gave up (300ms)", d)
	}
}

func TestRWMutex_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	var nilRW *lock.RWMutex
	cases := map[string]func() error{
		"empty name":        func() error { _, err := c.RWMutex("").RLock(bg); return err },
		"bad hash tag":      func() error { _, err := c.RWMutex("x}{").Lock(bg); return err },
		"negative wait":     func() error { _, err := c.RWMutex("x").TryRLock(bg, -1); return err },
		"negative wait W":   func() error { _, err := c.RWMutex("x").TryLock(bg, -1); return err },
		"negative lease":    func() error { _, err := c.RWMutex("x").RLock(bg, lock.WithLease(-1)); return err },
		"nil context":       func() error { _, err := c.RWMutex("x").Lock(nil); return err }, //nolint:staticcheck
		"nil rw mutex":      func() error { _, err := nilRW.RLock(bg); return err },
		"nil lock client":   func() error { var nc *lock.Client; _, err := nc.RWMutex("x").Lock(bg); return err },
		"runlock nil ctx":   func() error { return c.RWMutex("x").RUnlock(nil) }, //nolint:staticcheck
		"unlock empty name": func() error { return c.RWMutex("").Unlock(bg) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if err := c.RWMutex("x").RUnlock(bg); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("RUnlock without a hold = %v, want ErrNotHeld", err)
	}
	if n := srv.Do("DBSIZE"); n != int64(0) {
		t.Fatalf("bad input created %v keys", n)
	}
}

// A writer waiting in line keeps new readers out even in the moment the lock
// is free: between the last reader's release and the woken writer's attempt a
// new reader must not slip in.
func TestRWMutex_FreeLockWithAWaitingWriterAdmitsNoNewReader(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3)
	name := lockName(t)
	_, writers := rwKeys(name)
	bg := context.Background()
	const rounds = 30
	won := 0
	for i := 0; i < rounds; i++ {
		r, err := cs[0].RWMutex(name).RLock(bg)
		if err != nil {
			t.Fatal(err)
		}
		wrote, done := make(chan error, 1), make(chan struct{})
		go func() {
			w, err := cs[1].RWMutex(name).TryLock(bg, 5*time.Second)
			if err == nil {
				<-done // held until the reader has tried
				err = cs[1].RWMutex(name).Unlock(w)
			}
			wrote <- err
		}()
		eventually(t, 5*time.Second, "writer in line", func() bool { return srv.Do("ZCARD", writers) == int64(1) })
		if err := cs[0].RWMutex(name).RUnlock(r); err != nil {
			t.Fatal(err)
		}
		// The lock is free now, the writer woken but not yet in.
		if late, err := cs[2].RWMutex(name).TryRLock(bg, 0); err == nil {
			won++
			cs[2].RWMutex(name).RUnlock(late)
		} else if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatal(err)
		}
		close(done)
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
	}
	if won > 0 {
		t.Fatalf("a reader arriving after a waiting writer got the free lock first in %d of %d rounds", won, rounds)
	}
}

// rwKeys returns the Redis keys of an RWMutex's read leases and writers' line.
func rwKeys(name string) (readers, writers string) {
	return "seckillguard_rwlock_readers:{" + name + "}", "seckillguard_rwlock_writers:{" + name + "}"
}
