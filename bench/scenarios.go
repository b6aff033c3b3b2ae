package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// env is the Redis every run uses, and a client of the harness's own for
// INFO and FLUSHALL (its commands are left out of every count).
type env struct {
	addr  string
	admin *redis.Client
}

// client returns a new go-redis client (its own connection pool: one
// "instance") with hooks added.
func (e *env) client(hooks ...redis.Hook) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: e.addr})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	return rdb
}

// reset deletes every key a run left behind.
func (e *env) reset(ctx context.Context) error {
	return e.admin.FlushAll(ctx).Err()
}

// ---- uncontended ----

// uncontended is one goroutine locking and unlocking a lock nobody else uses.
type uncontended struct {
	cycles  []time.Duration // each Lock+Unlock, sorted
	outside []time.Duration // each Lock+Unlock's time outside go-redis (see inGoRedis), sorted
	blocks  []time.Duration // the median Lock+Unlock of each block, in block order
	cost    cost            // summed over the blocks
}

// runUncontended measures every contender's uncontended Lock+Unlock. The
// cycles are run in blocks of ops/blocks, the contenders taking turns block
// by block in a rotating order, so that a burst of noise from elsewhere on
// the machine hits all of them alike.
func runUncontended(ctx context.Context, e *env, cs []contender, ops, blocks int, prefix string) (map[string]uncontended, error) {
	type subject struct {
		c    contender
		sent *testenv.CommandCounter
		in   *inGoRedis
		m    mutex
		out  uncontended
	}
	subs := make([]*subject, len(cs))
	for i, c := range cs {
		sent, in := testenv.NewCommandCounter(), new(inGoRedis)
		rdb := e.client(sent, in)
		defer rdb.Close()
		inst := c.open(rdb)
		defer inst.close()
		subs[i] = &subject{c: c, sent: sent, in: in, m: inst.mutex(prefix + ":" + strconv.Itoa(i))}
	}
	cycle := func(s *subject) error {
		if err := s.m.lock(ctx); err != nil {
			return fmt.Errorf("%s: lock: %w", s.c.name, err)
		}
		if err := s.m.unlock(); err != nil {
			return fmt.Errorf("%s: unlock: %w", s.c.name, err)
		}
		return nil
	}
	for _, s := range subs {
		for range 20 { // load the scripts, open the connection
			if err := cycle(s); err != nil {
				return nil, err
			}
		}
	}
	blocks = max(1, min(blocks, ops))
	for b := range blocks {
		n := ops / blocks
		if b < ops%blocks {
			n++
		}
		for j := range subs {
			s := subs[(b+j)%len(subs)]
			runtime.GC()
			before, err := takeSnapshot(ctx, e.admin, s.sent.Total())
			if err != nil {
				return nil, err
			}
			for range n {
				t, in := time.Now(), s.in.d
				if err := cycle(s); err != nil {
					return nil, err
				}
				d := time.Since(t)
				s.out.cycles = append(s.out.cycles, d)
				s.out.outside = append(s.out.outside, d-(s.in.d-in))
			}
			block := sortDurations(slices.Clone(s.out.cycles[len(s.out.cycles)-n:]))
			s.out.blocks = append(s.out.blocks, time.Duration(percentile(block, 50)))
			after, err := takeSnapshot(ctx, e.admin, s.sent.Total())
			if err != nil {
				return nil, err
			}
			s.out.cost = s.out.cost.plus(costBetween(before, after))
		}
	}
	out := make(map[string]uncontended, len(subs))
	for _, s := range subs {
		sortDurations(s.out.cycles)
		sortDurations(s.out.outside)
		out[s.c.name] = s.out
	}
	return out, nil
}

// ---- contended ----

// load describes a contended run: clients instances × goroutines each, every
// goroutine locking in a loop with no pause between its acquisitions.
//
// A timed run has three phases: warm-up (not measured), the measured window,
// and a drain during which the load goes on until every wait that went on
// during the window has ended, or the drain time is up. Throughput and costs
// are those of the window; the waits are every wait that went on at some
// time during it (begun in it, or begun in the warm-up and not over when it
// started), so that a goroutine starved since the warm-up is counted too.
type load struct {
	clients    int           // instances, each with its own connection pool
	goroutines int           // per instance
	keys       int           // lock names; each acquisition picks one at random
	hold       time.Duration // critical section
	warmup     time.Duration
	duration   time.Duration // the measured window, when count is 0
	drain      time.Duration // the longest drain
	count      int64         // otherwise: measure exactly this many acquisitions (go test -bench)
}

// contended is the outcome of a contended run.
type contended struct {
	acquisitions int64           // in the window
	perClient    []int64         // acquisitions in the window by instance
	unserved     int             // goroutines that did not acquire once in the window
	window       time.Duration   // its length
	waits        []time.Duration // sorted; waits still going on when the drain ended are included with their length so far
	served       []time.Duration // sorted: the waits of the acquisitions made in the window, and only those
	censored     int             // how many of the waits were cut short that way
	cut          []time.Duration // sorted: those waits, at their length when the drain ended
	errors       int64           // failed lock or unlock calls (not counting the end of the run)
	cost         cost            // during the window
}

const (
	phaseWarmup int32 = iota
	phaseWindow
	phaseDrain
)

func runContended(ctx context.Context, e *env, c contender, ld load, prefix string) (contended, error) {
	sent := testenv.NewCommandCounter()
	insts := make([]instance, ld.clients)
	rdbs := make([]*redis.Client, ld.clients)
	for i := range insts {
		rdbs[i] = e.client(sent)
		insts[i] = c.open(rdbs[i])
	}
	defer func() {
		for i := range insts {
			insts[i].close()
			_ = rdbs[i].Close()
		}
	}()
	names := make([]string, ld.keys)
	for k := range names {
		names[k] = prefix + ":" + strconv.Itoa(k)
	}
	if err := warm(ctx, insts, rdbs, ld.goroutines, prefix+":warm"); err != nil {
		return contended{}, fmt.Errorf("%s: %w", c.name, err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		phase     atomic.Int32
		left      atomic.Int64
		pending   atomic.Int64 // waits that may count and have not ended
		failures  atomic.Int64
		cut       atomic.Int64
		wg        sync.WaitGroup
		start     = make(chan struct{})
		perG      = make([][]time.Duration, ld.clients*ld.goroutines)
		perGDone  = make([][]time.Duration, ld.clients*ld.goroutines)
		perGCut   = make([][]time.Duration, ld.clients*ld.goroutines) // a goroutine's wait cut short, if any
		perClient = make([]atomic.Int64, ld.clients)
		unserved  atomic.Int64
	)
	// On every return: stop the goroutines before the instances close.
	defer func() {
		cancel()
		wg.Wait()
	}()
	left.Store(ld.count)
	if ld.count > 0 {
		phase.Store(phaseWindow)
	}
	for i, inst := range insts {
		for g := range ld.goroutines {
			wg.Add(1)
			go func(slot int) {
				defer wg.Done()
				ms := make([]mutex, ld.keys)
				waits := make([]time.Duration, 0, 512)
				done := make([]time.Duration, 0, 512)
				served := 0
				defer func() {
					perG[slot], perGDone[slot] = waits, done
					if served == 0 {
						unserved.Add(1)
					}
				}()
				select {
				case <-start:
				case <-runCtx.Done():
					return
				}
				for runCtx.Err() == nil {
					if ld.count > 0 && left.Add(-1) < 0 {
						return
					}
					k := 0
					if ld.keys > 1 {
						k = rand.IntN(ld.keys)
					}
					if ms[k] == nil {
						ms[k] = inst.mutex(names[k])
					}
					// A wait counts when it goes on at some time during the
					// window: begun in it, or begun before and not ended
					// before it started. A goroutine starved since the
					// warm-up counts too.
					began := phase.Load()
					candidate := began != phaseDrain
					if candidate {
						pending.Add(1)
					}
					t0 := time.Now()
					err := ms[k].lock(runCtx)
					w := time.Since(t0)
					counted := candidate && (began == phaseWindow || phase.Load() != phaseWarmup)
					if candidate {
						if counted && (err == nil || runCtx.Err() != nil) {
							waits = append(waits, w)
						}
						pending.Add(-1)
					}
					if err != nil {
						if runCtx.Err() != nil {
							if counted {
								cut.Add(1)
								perGCut[slot] = []time.Duration{w}
							}
							return
						}
						failures.Add(1)
						continue
					}
					if phase.Load() == phaseWindow {
						perClient[i].Add(1)
						served++
						done = append(done, w)
					}
					critical(ld.hold)
					if err := ms[k].unlock(); err != nil {
						failures.Add(1)
					}
				}
			}(i*ld.goroutines + g)
		}
	}

	var before, after snapshot
	var window time.Duration
	var err error
	sleep := func(d time.Duration) error { return sleepCtx(ctx, d) }
	if ld.count > 0 {
		runtime.GC()
		if before, err = takeSnapshot(ctx, e.admin, sent.Total()); err != nil {
			return contended{}, err
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		window = time.Since(t0)
		if after, err = takeSnapshot(ctx, e.admin, sent.Total()); err != nil {
			return contended{}, err
		}
	} else {
		runtime.GC()
		close(start)
		if err := sleep(ld.warmup); err != nil {
			return contended{}, err
		}
		if before, err = takeSnapshot(ctx, e.admin, sent.Total()); err != nil {
			return contended{}, err
		}
		phase.Store(phaseWindow)
		t0 := time.Now()
		if err := sleep(ld.duration); err != nil {
			return contended{}, err
		}
		phase.Store(phaseDrain)
		window = time.Since(t0)
		if after, err = takeSnapshot(ctx, e.admin, sent.Total()); err != nil {
			return contended{}, err
		}
		for end := time.Now().Add(ld.drain); pending.Load() > 0 && time.Now().Before(end); {
			if err := sleep(time.Millisecond); err != nil {
				return contended{}, err
			}
		}
		cancel()
		wg.Wait()
	}

	out := contended{window: window, censored: int(cut.Load()), unserved: int(unserved.Load()), errors: failures.Load(), cost: costBetween(before, after)}
	for i := range perClient {
		n := perClient[i].Load()
		out.perClient = append(out.perClient, n)
		out.acquisitions += n
	}
	for _, w := range perG {
		out.waits = append(out.waits, w...)
	}
	for _, w := range perGDone {
		out.served = append(out.served, w...)
	}
	for _, w := range perGCut {
		out.cut = append(out.cut, w...)
	}
	sortDurations(out.cut)
	sortDurations(out.served)
	sortDurations(out.waits)
	return out, nil
}

// warm loads each instance's scripts (one lock and unlock) and opens as many
// connections as its goroutines will use at once, so that neither is
// counted in the run.
func warm(ctx context.Context, insts []instance, rdbs []*redis.Client, goroutines int, name string) error {
	for _, inst := range insts {
		m := inst.mutex(name)
		if err := m.lock(ctx); err != nil {
			return fmt.Errorf("warm-up lock: %w", err)
		}
		if err := m.unlock(); err != nil {
			return fmt.Errorf("warm-up unlock: %w", err)
		}
	}
	var wg sync.WaitGroup
	for _, rdb := range rdbs {
		n := min(goroutines, rdb.Options().PoolSize)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = rdb.Ping(ctx).Err()
			}()
		}
	}
	wg.Wait()
	return nil
}

// ---- handoff ----

// runHandoff measures how long a lock stays free between its holder's unlock
// and the moment a waiter of another instance holds it: the holder locks,
// the waiter starts waiting, the holder unlocks after 5–25 ms (so that
// polling waiters are caught at any point of their retry delay), and the
// time from the start of Unlock to the waiter's Lock returning is recorded.
func runHandoff(ctx context.Context, e *env, c contender, n int, name string) ([]time.Duration, error) {
	ra, rb := e.client(), e.client()
	defer ra.Close()
	defer rb.Close()
	a, b := c.open(ra), c.open(rb)
	defer a.close()
	defer b.close()
	ma, mb := a.mutex(name), b.mutex(name)
	var out []time.Duration
	for i := -1; i < n; i++ { // i == -1 warms up and is not recorded
		if err := ma.lock(ctx); err != nil {
			return nil, fmt.Errorf("%s: holder lock: %w", c.name, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		got := make(chan time.Time, 1)
		failed := make(chan error, 1)
		go func() {
			if err := mb.lock(wctx); err != nil {
				failed <- err
				return
			}
			got <- time.Now()
		}()
		time.Sleep(5*time.Millisecond + rand.N(20*time.Millisecond))
		t0 := time.Now()
		if err := ma.unlock(); err != nil {
			cancel()
			return nil, fmt.Errorf("%s: holder unlock: %w", c.name, err)
		}
		select {
		case t1 := <-got:
			if i >= 0 {
				out = append(out, t1.Sub(t0))
			}
		case err := <-failed:
			cancel()
			return nil, fmt.Errorf("%s: waiter lock: %w", c.name, err)
		}
		cancel()
		if err := mb.unlock(); err != nil {
			return nil, fmt.Errorf("%s: waiter unlock: %w", c.name, err)
		}
	}
	return sortDurations(out), nil
}

// ---- many locks held by one Client ----

// Watchdog batching, as lock/watchdog.go does it: one renewal script call
// renews up to renewChunk locks, and up to renewCallsPerRoundTrip calls share
// one pipelined round trip.
const (
	renewChunk             = 512
	renewCallsPerRoundTrip = 64
)

// expectedRoundTrips is the number of round trips one renewal pass over n
// locks of one hash slot group needs when batching works as designed.
func expectedRoundTrips(n int) int {
	calls := (n + renewChunk - 1) / renewChunk
	return (calls + renewCallsPerRoundTrip - 1) / renewCallsPerRoundTrip
}

// held is what one Client holding n locks costs.
type held struct {
	n           int
	acquire     time.Duration // taking all n, 32 goroutines at a time
	goroutines  int           // goroutines added while the locks are held
	heap        uint64        // live heap added while the locks are held (after GC)
	window      time.Duration // observation while held, nothing else running
	roundTrips  int64         // pipelined round trips sent in the window (the watchdog's)
	single      int64         // non-pipelined commands sent in the window (should be none)
	scriptCalls int64         // renewal script calls in those pipelines
	passes      int           // renewal passes in the window
	busy        time.Duration // time spent in those round trips
	renewed     int64         // PEXPIREs Redis ran in the window
	lostTaking  int           // locks already lost when the last was taken
	lost        int           // locks lost from acquisition to the end of the window
	lostWhy     string        // the first lost lock's cause
}

// pipeCounter is a go-redis hook that counts the pipelined round trips of
// script calls (the watchdog's renewals) and times them.
type pipeCounter struct {
	mu     sync.Mutex
	starts []time.Time
	cmds   int64
	busy   time.Duration
	single int64
}

func (p *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.mu.Lock()
		p.single++
		p.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (p *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || (cmds[0].Name() != "evalsha" && cmds[0].Name() != "eval") {
			return next(ctx, cmds) // a new connection's HELLO and CLIENT SETINFO
		}
		t := time.Now()
		err := next(ctx, cmds)
		d := time.Since(t)
		p.mu.Lock()
		p.starts = append(p.starts, t)
		p.cmds += int64(len(cmds))
		p.busy += d
		p.mu.Unlock()
		return err
	}
}

func (p *pipeCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.starts)
}

func (p *pipeCounter) last() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.starts) == 0 {
		return time.Time{}
	}
	return p.starts[len(p.starts)-1]
}

func (p *pipeCounter) reset() {
	p.mu.Lock()
	p.starts, p.cmds, p.busy, p.single = nil, 0, 0, 0
	p.mu.Unlock()
}

// passes groups the round trips into renewal passes: round trips less than
// gap apart belong to one pass.
func (p *pipeCounter) passes(gap time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := append([]time.Time(nil), p.starts...)
	sort.Slice(s, func(i, j int) bool { return s[i].Before(s[j]) })
	n := 0
	for i := range s {
		if i == 0 || s[i].Sub(s[i-1]) > gap {
			n++
		}
	}
	return n
}

func runHeld(ctx context.Context, e *env, n int, watchdog, window time.Duration, prefix string) (held, error) {
	pc := &pipeCounter{}
	rdb := e.client(pc)
	defer rdb.Close()
	c := lock.New(rdb, lock.WithWatchdogTimeout(watchdog))
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	// Warm up: scripts loaded, connections open.
	w, err := c.Mutex(prefix + ":warm").Lock(ctx)
	if err != nil {
		return held{}, err
	}
	_ = c.Mutex(prefix + ":warm").Unlock(w)
	// Open the connections the 32 acquiring goroutines will use, so that
	// their buffers are not counted as the locks' heap.
	var pings sync.WaitGroup
	for range 32 {
		pings.Add(1)
		go func() {
			defer pings.Done()
			_ = rdb.Ping(ctx).Err()
		}()
	}
	pings.Wait()

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0, g0 := ms.HeapAlloc, runtime.NumGoroutine()

	ctxs := make([]context.Context, n)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	t0 := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				h, err := c.Mutex(prefix + ":" + strconv.Itoa(i)).Lock(ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				ctxs[i] = h
			}
		}()
	}
	wg.Wait()
	acquire := time.Since(t0)
	if firstErr != nil {
		return held{}, firstErr
	}

	runtime.GC()
	runtime.ReadMemStats(&ms)
	out := held{n: n, acquire: acquire, goroutines: runtime.NumGoroutine() - g0}
	for _, h := range ctxs {
		if h.Err() != nil {
			out.lostTaking++
		}
	}
	if ms.HeapAlloc > heap0 {
		out.heap = ms.HeapAlloc - heap0
	}

	// Start observing right after a renewal pass, so that the window holds
	// whole passes and none of them is the first (which may find the
	// renewal script not yet loaded on the server).
	period := watchdog / 3
	for seen := pc.count(); ; {
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return held{}, err
		}
		if pc.count() > seen && time.Since(pc.last()) > period/10 {
			break
		}
		if time.Since(t0) > acquire+3*period {
			return held{}, fmt.Errorf("no renewal pass within %v of holding %d locks", 3*period, n)
		}
	}
	pc.reset()
	before, err := readServerStats(ctx, e.admin)
	if err != nil {
		return held{}, err
	}
	start := time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return held{}, err
	}
	out.window = time.Since(start)
	after, err := readServerStats(ctx, e.admin)
	if err != nil {
		return held{}, err
	}
	out.goroutines = max(out.goroutines, runtime.NumGoroutine()-g0)
	pc.mu.Lock()
	out.roundTrips, out.scriptCalls, out.busy, out.single = int64(len(pc.starts)), pc.cmds, pc.busy, pc.single
	pc.mu.Unlock()
	out.passes = pc.passes(period / 2)
	out.renewed = after.calls["pexpire"] - before.calls["pexpire"]

	// Still held? A lock whose renewal came too late is lost, and its
	// context says why.
	for _, h := range ctxs {
		if h.Err() != nil {
			if out.lost == 0 {
				out.lostWhy = context.Cause(h).Error()
			}
			out.lost++
		}
	}
	closed = true
	_ = c.Close()
	runtime.KeepAlive(ctxs)
	return out, nil
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
