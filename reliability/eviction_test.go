package reliability

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// Redis under maxmemory evicts a held lock's key and its token counter
// (allkeys-lru evicts any key; volatile-lru only keys with an expiry, which
// both have: the lease, and the counter's idle expiry). The holder is told
// within a renewal period that its lock is gone, its write is refused; the
// next holder's token is newer although the counter is gone, because tokens
// follow Redis TIME; the history is clean. Under volatile-lru with memory
// still full of keys without expiry an acquisition fails with Redis's OOM
// error — never "busy".
func TestEviction_LockKeyAndTokenCounterEvictedUnderMaxmemory(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			const (
				key      = "sku:evict"
				counter  = "redisson_lock_token:{" + key + "}"
				watchdog = 900 * time.Millisecond
				period   = watchdog / 3
			)
			srv := testenv.Redis(t)
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

			// Memory runs out: a limit just above what is used, and values
			// written until both of the lock's keys are evicted.
			info := srv.Do("INFO", "memory").(string)
			used := 0
			for _, l := range strings.Split(info, "\r\n") {
				if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
					used, _ = strconv.Atoi(v)
				}
			}
			srv.Do("CONFIG", "SET", "maxmemory-policy", policy)
			srv.Do("CONFIG", "SET", "maxmemory", strconv.Itoa(used+4<<20))
			filler := srv.Client()
			value := strings.Repeat("x", 32<<10)
			evictedAt := time.Time{}
			// Both keys have an expiry (the lease, the counter's idle
			// expiry), so both policies evict both.
			gone := []any{"EXISTS", key, counter}
			for i := 0; ; i++ {
				if srv.Do(gone...) == int64(0) {
					evictedAt = history.Now()
					break
				}
				if i == 5000 {
					t.Fatalf("the lock's keys survived %d values of 32 KiB under %s", i, policy)
				}
				_ = filler.Set(context.Background(), "filler:"+strconv.Itoa(i), value, 0).Err() // OOM once nothing is left to evict
			}

			if policy == "volatile-lru" {
				// Nothing with an expiry is left to evict: writes fail.
				_, err := b.Mutex(key).TryLock(context.Background(), 0)
				if err == nil || errors.Is(err, lock.ErrNotAcquired) || !strings.Contains(err.Error(), "OOM") {
					t.Fatalf("acquisition on a full volatile-lru Redis: %v, want Redis's OOM error, not busy", err)
				}
				srv.Do("CONFIG", "SET", "maxmemory", "0") // memory is added
			}

			select {
			case <-actx.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the holder whose lock key was evicted was never told")
			}
			if cause := context.Cause(actx); !errors.Is(cause, lock.ErrLost) {
				t.Fatalf("the holder's context ended with %v, want lock.ErrLost", cause)
			}
			eventually(t, time.Second, "the loss recorded", func() bool { return sa.lostAt.Load() != 0 })
			told := time.Unix(0, sa.lostAt.Load()).Sub(evictedAt)

			bctx, err := b.Mutex(key).TryLock(context.Background(), 5*time.Second)
			if err != nil {
				t.Fatalf("the next holder: %v", err)
			}
			sb := enter(rec, "b", key, bctx)
			if sb.Token() <= sa.Token() {
				t.Fatalf("the next holder's token %d is not above the evicted holder's %d", sb.Token(), sa.Token())
			}
			if err := sb.Read(db); err != nil {
				t.Fatal(err)
			}
			if _, err := sb.Write(db, true); err != nil {
				t.Fatalf("the next holder's write: %v", err)
			}
			sb.Leave()
			_ = b.Mutex(key).Unlock(bctx)

			if w, err := sa.Write(db, true); w.Accepted || !errors.Is(err, fencing.ErrStale) {
				t.Fatalf("the evicted holder's write: %v, want refused as stale", err)
			}
			sa.Leave()
			r := check(t, rec, db, history.NoticeWithin(period+200*time.Millisecond))
			t.Logf("%s: the holder was told %v after the eviction; %s", policy, told.Round(time.Millisecond), r)
			if !r.OK() {
				t.Fatalf("history: %s", r)
			}
		})
	}
}
