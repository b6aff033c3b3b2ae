package reliability

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// netWorker is one process of a contended run: a lock Client whose Redis
// connections all go through a proxy of its own.
type netWorker struct {
	name  string
	proxy *faults.Proxy
	locks *lock.Client

	holds, busy, failed, unlockErrs atomic.Int64

	stall *staller
}

// staller picks a victim among the workers: once armed, the next critical
// section any worker enters lasts until its lock is lost (at most 20s), and
// that worker is sent on victim.
type staller struct {
	armed  atomic.Bool
	victim chan *netWorker
}

func newNetWorker(t *testing.T, name, target string, watchdog time.Duration, stall *staller) *netWorker {
	t.Helper()
	p, err := faults.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &netWorker{name: name, proxy: p, stall: stall,
		locks: lockClient(t, p.Addr, func(o *redis.Options) { o.PoolSize = 8 }, lock.WithWatchdogTimeout(watchdog))}
}

// run takes key again and again until stop, incrementing its register in
// each critical section, which lasts at least hold.
func (w *netWorker) run(stop <-chan struct{}, rec *history.Recorder, db *gorm.DB, key string, hold time.Duration) {
	m := w.locks.Mutex(key)
	for {
		select {
		case <-stop:
			return
		default:
		}
		ctx, err := m.TryLock(context.Background(), 3*time.Second)
		switch {
		case errors.Is(err, lock.ErrNotAcquired):
			w.busy.Add(1)
			continue
		case err != nil:
			w.failed.Add(1)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		w.holds.Add(1)
		s := enter(rec, w.name, key, ctx)
		if s.Read(db) == nil {
			wait := hold
			if w.stall.armed.CompareAndSwap(true, false) {
				wait = 20 * time.Second
				w.stall.victim <- w
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			_, _ = s.Write(db, true)
		}
		s.Leave()
		for range 3 { // a reset may eat the release; Unlock may be retried
			err := m.Unlock(ctx)
			if err == nil || errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrNotHeld) {
				break
			}
			w.unlockErrs.Add(1)
		}
	}
}

// A contended run through a slow, lossy network: every Client's connections
// get 200ms of latency each way and lose 5% of their chunks to a reset, and
// one worker is cut off from Redis in the middle of a critical section.
// Holds that were never told of a loss never overlap (the cut-off worker is
// told, late: see docs/RELIABILITY.md), every write of a hold told of its
// loss is refused, and the register holds exactly the accepted increments.
func TestNetwork_LatencyAndResetsKeepExclusion(t *testing.T) {
	const (
		keys     = 3
		perKey   = 3
		watchdog = 2 * time.Second
		runFor   = 6 * time.Second
	)
	srv := testenv.Redis(t)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("sku:net-%d", i)
	}
	db, _ := registers(t, names...)
	rec := history.NewRecorder()
	var workers []*netWorker
	stall := &staller{victim: make(chan *netWorker, 1)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, name := range names {
		for j := range perKey {
			w := newNetWorker(t, fmt.Sprintf("w%d.%d", i, j), srv.Addr, watchdog, stall)
			w.proxy.SetLatency(200 * time.Millisecond)
			w.proxy.SetResetRate(0.05)
			workers = append(workers, w)
			wg.Add(1)
			go func() { defer wg.Done(); w.run(stop, rec, db, name, 20*time.Millisecond) }()
		}
	}
	// A second into the run, the next worker to enter a critical section
	// is cut off from Redis in its middle; the section lasts until the
	// worker is told of its loss. (Any worker: a given one may be outrun
	// for many turns at 400ms a round trip.)
	time.Sleep(time.Second)
	stall.armed.Store(true)
	var victim *netWorker
	select {
	case victim = <-stall.victim:
	case <-time.After(10 * time.Second):
		t.Fatal("no worker entered a critical section for 10s")
	}
	victim.proxy.SetBlackhole(true)
	time.Sleep(runFor - time.Second)
	close(stop)
	for _, w := range workers { // heal, so that every worker ends its last hold
		w.proxy.SetResetRate(0)
		w.proxy.SetLatency(0)
		w.proxy.SetBlackhole(false)
	}
	wg.Wait()

	var holds, busy, failed, unlockErrs, resets int64
	for _, w := range workers {
		holds += w.holds.Load()
		busy += w.busy.Load()
		failed += w.failed.Load()
		unlockErrs += w.unlockErrs.Load()
		resets += w.proxy.Stats().Resets
	}
	r := check(t, rec, db)
	t.Logf("%d holds, %d busy, %d failed acquisitions, %d failed unlocks, %d connection resets; %s",
		holds, busy, failed, unlockErrs, resets, r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
	if holds < 10 || resets < 5 || r.Summary.LostHolds < 1 {
		t.Fatalf("the run did too little to show anything: %d holds, %d resets, %d holds lost", holds, resets, r.Summary.LostHolds)
	}
}
