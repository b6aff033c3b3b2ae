package lock_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// The randomized model test: several Clients on one Redis (TestModel) or on
// a Redis Cluster (TestModel_Cluster) run random programs over the whole
// lock family — Lock/TryLock/Unlock, re-entry of the same kind and across
// kinds (a Mutex under a MultiLock, a FairMutex and a Mutex of one name, an
// RWMutex's downgrade and refused upgrade, Semaphore permits), goroutines
// that share a context and goroutines that do not, cancellations at random
// points — while faults hit them: delays and resets between a Client and
// Redis, a Client cut off, the lock key deleted, the token counter rolled
// back, Redis restarted. Every step is checked against the model in
// modelcheck_test.go; after every round everything is released and neither
// Redis nor a Client may keep anything; at the end no goroutine may be left.
//
// A run is determined by its seed: the operations each goroutine draws and
// the faults come from it (what they meet depends on timing). A failing run
// prints its seed and the command that runs it again. In CI each variant
// runs for a few seconds; longer with -model.duration:
//
//	go test ./lock -run 'TestModel' -model.duration=30m -model.seed=42
var (
	modelSeedFlag     = flag.Uint64("model.seed", 0, "seed of the randomized model test (0: a new one, printed); env MODEL_SEED")
	modelDurationFlag = flag.Duration("model.duration", 0, "how long each model test variant runs (default 16s single Redis, 9s Cluster); env MODEL_DURATION")
	modelMixFlag      = flag.String("model.mix", "", "operation mixes to switch on (+name) or off (-name), comma-separated; env MODEL_MIX. Names: "+strings.Join(modelMixNames(), ", "))
)

// modelMixes are the parts of the operation mix that can be switched; the
// value is the default.
var modelMixes = map[string]bool{
	"fanout":   true, // goroutines sharing a lock context re-enter its hold
	"fresh":    true, // goroutines sharing a request context take locks of their own: they must exclude each other (ownership per hold)
	"lifetime": true, // a request whose context ended skips its Unlocks: its holds must be released by themselves
	"cancel":   true, // request contexts and per-call deadlines end at random points
	"lease":    true, // fixed leases (WithLease), some shorter than the work
	"multi":    true, // MultiLocks, over free names and over names already held
	"rw":       true, // RWMutex read and write holds, downgrades, refused upgrades
	"sem":      true, // Semaphores of 1 and 2 permits
	"fair":     true, // FairMutexes on the Mutexes' names
	"other":    true, // a goroutine takes a lock through another Client than its own
	"net":      true, // delays and resets between a Client and Redis
	"cutoff":   true, // a Client cut off from Redis (blackhole) for up to 1.5 leases
	"delete":   true, // a lock key deleted under its holders
	"rollback": true, // the token counter rolled back (while below the Redis clock)
	"restart":  true, // Redis restarted, its data gone (single Redis only)
	"long":     true, // work longer than the watchdog's period, so renewals matter
	"release":  true, // re-entries with a lease, which extends a fixed hold and leaves a watchdog hold as it is
	"multire":  true, // MultiLocks over names the goroutine holds already
	"red":      true, // RedLocks over three more Redis servers, from two sets of Clients (single Redis only)
}

func modelMixNames() []string {
	var out []string
	for k := range modelMixes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// modelConfig is one run's settings.
type modelConfig struct {
	seed     uint64
	duration time.Duration
	round    time.Duration
	actors   int
	mix      map[string]bool
	mixArg   string
	timing   modelTiming
}

func modelSettings(t *testing.T, defaultDuration time.Duration) modelConfig {
	cfg := modelConfig{duration: defaultDuration, round: 3 * time.Second, actors: 8, mix: make(map[string]bool)}
	for k, v := range modelMixes {
		cfg.mix[k] = v
	}
	cfg.seed = *modelSeedFlag
	if s := os.Getenv("MODEL_SEED"); s != "" && cfg.seed == 0 {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MODEL_SEED=%q: %v", s, err)
		}
		cfg.seed = v
	}
	if cfg.seed == 0 {
		cfg.seed = rand.Uint64()>>1 | 1
	}
	if *modelDurationFlag > 0 {
		cfg.duration = *modelDurationFlag
	} else if s := os.Getenv("MODEL_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("MODEL_DURATION=%q: %v", s, err)
		}
		cfg.duration = d
	}
	cfg.mixArg = *modelMixFlag
	if cfg.mixArg == "" {
		cfg.mixArg = os.Getenv("MODEL_MIX")
	}
	for _, part := range strings.Split(cfg.mixArg, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		on := !strings.HasPrefix(part, "-")
		name := strings.TrimLeft(part, "+-")
		if _, ok := modelMixes[name]; !ok {
			t.Fatalf("-model.mix: unknown mix %q (known: %s)", name, strings.Join(modelMixNames(), ", "))
		}
		cfg.mix[name] = on
	}
	lease := 2 * time.Second
	cfg.timing = modelTiming{grace: 250 * time.Millisecond, period: lease / 3, lease: lease, slack: 500 * time.Millisecond}
	return cfg
}

// modelEnv is the deployment a run drives.
type modelEnv struct {
	cluster  bool
	srv      *testenv.RedisServer // single Redis
	admin    redis.UniversalClient
	clients  []*lock.Client
	rdbs     []redis.UniversalClient
	proxies  []*faults.Proxy  // per Client; nil for a Client without one
	red      [][]*lock.Client // RedLock instances: one Client per node each
	redNodes []*redis.Client  // the RedLock nodes, for inspection
	exNames  []string         // Mutex, FairMutex, MultiLock
	rwNames  []string
	semNames []string
	permits  map[string]int
}

func (e *modelEnv) allNames() []string {
	return append(append(append([]string{}, e.exNames...), e.rwNames...), e.semNames...)
}

var modelLeakOptions = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/seckillguard/seckillguard/internal/testkit/testenv.(*RedisServer).start.func1"),
}

func TestModel(t *testing.T) {
	cfg := modelSettings(t, 16*time.Second)
	defer goleak.VerifyNone(t, append(modelLeakOptions, goleak.IgnoreCurrent())...)
	srv := testenv.Redis(t)
	e := &modelEnv{srv: srv, permits: map[string]int{}}
	e.admin = redis.NewClient(&redis.Options{Addr: srv.Addr})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 4; i++ {
		addr := srv.Addr
		var p *faults.Proxy
		if i < 3 { // the fourth Client talks to Redis directly
			var err error
			if p, err = faults.NewProxy(srv.Addr); err != nil {
				t.Fatal(err)
			}
			addr = p.Addr
		}
		o := &redis.Options{Addr: addr}
		if i == 0 {
			o.MaxRetries = -1 // network errors reach the engine (go-redis retries them by default)
		}
		rdb := redis.NewClient(o)
		e.proxies = append(e.proxies, p)
		e.rdbs = append(e.rdbs, rdb)
		e.clients = append(e.clients, lock.New(rdb, lock.WithWatchdogTimeout(cfg.timing.lease), lock.WithLogger(logger)))
	}
	e.exNames = []string{"model:e0", "model:e1", "model:e2"}
	e.rwNames = []string{"model:rw"}
	e.semNames = []string{"model:s1", "model:s2"}
	e.permits = map[string]int{"model:s1": 1, "model:s2": 2}
	if cfg.mix["red"] {
		nodes := []*testenv.RedisServer{testenv.Redis(t), testenv.Redis(t), testenv.Redis(t)}
		for _, n := range nodes {
			e.redNodes = append(e.redNodes, redis.NewClient(&redis.Options{Addr: n.Addr}))
		}
		for inst := 0; inst < 2; inst++ {
			var cs []*lock.Client
			for _, n := range nodes {
				rdb := redis.NewClient(&redis.Options{Addr: n.Addr})
				e.rdbs = append(e.rdbs, rdb)
				cs = append(cs, lock.New(rdb, lock.WithWatchdogTimeout(cfg.timing.lease), lock.WithLogger(logger)))
			}
			e.red = append(e.red, cs)
		}
	}
	runModel(t, cfg, e)
}

// redClient is the model's number of the first RedLock instance's Clients.
const redClient = 100

func TestModel_Cluster(t *testing.T) {
	cfg := modelSettings(t, 9*time.Second)
	cfg.mix["restart"] = false
	defer goleak.VerifyNone(t, append(modelLeakOptions, goleak.IgnoreCurrent())...)
	env := testenv.Cluster(t, 3)
	e := &modelEnv{cluster: true}
	e.admin = redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Addrs()})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 3; i++ {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Addrs()})
		e.proxies = append(e.proxies, nil)
		e.rdbs = append(e.rdbs, rdb)
		e.clients = append(e.clients, lock.New(rdb, lock.WithWatchdogTimeout(cfg.timing.lease), lock.WithLogger(logger)))
	}
	// The exclusive names live on every master, so that MultiLocks span slots.
	e.exNames = namesOnEveryMaster(t, e.admin.(*redis.ClusterClient), "model:e", 3)
	e.rwNames = []string{"model:rw"}
	e.semNames = []string{"model:s1", "model:s2"}
	e.permits = map[string]int{"model:s1": 1, "model:s2": 2}
	runModel(t, cfg, e)
}

// runModel runs rounds of random programs and faults until cfg.duration has
// passed or the model found a violation, and then checks that nothing is
// left behind.
func runModel(t *testing.T, cfg modelConfig, e *modelEnv) {
	m := newModel(cfg.timing)
	repro := fmt.Sprintf("go test ./lock -count=1 -run '^%s$' -model.seed=%d -model.duration=%v", t.Name(), cfg.seed, cfg.duration)
	if cfg.mixArg != "" {
		repro += " -model.mix=" + cfg.mixArg
	}
	t.Logf("seed %d; reproduce: %s", cfg.seed, repro)
	var on []string
	for _, k := range modelMixNames() {
		if cfg.mix[k] {
			on = append(on, k)
		}
	}
	t.Logf("mixes on: %s", strings.Join(on, ","))

	sweepDone := make(chan struct{})
	sweepStop := make(chan struct{})
	go func() {
		defer close(sweepDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sweepStop:
				return
			case now := <-tick.C:
				m.sweep(now)
			}
		}
	}()
	closeAll := func() {
		for _, c := range e.clients {
			c.Close()
		}
		for _, cs := range e.red {
			for _, c := range cs {
				c.Close()
			}
		}
		for _, r := range e.redNodes {
			r.Close()
		}
		for _, r := range e.rdbs {
			r.Close()
		}
		for _, p := range e.proxies {
			if p != nil {
				p.Close()
			}
		}
		e.admin.Close()
	}
	writeLog := func() {
		if path := os.Getenv("MODEL_LOG"); path != "" { // the whole event log, for a closer look
			m.mu.Lock()
			err := os.WriteFile(path, []byte(strings.Join(m.log, "\n")+"\n"), 0o644)
			m.mu.Unlock()
			if err != nil {
				t.Log(err)
			}
		}
	}
	fail := func(msg string) {
		writeLog()
		close(sweepStop)
		<-sweepDone
		closeAll()
		t.Fatalf("%s\n%s\nseed %d; reproduce: %s", msg, m.report(e.allNames()), cfg.seed, repro)
	}

	actors := make([]*actor, cfg.actors)
	for i := range actors {
		actors[i] = &actor{id: fmt.Sprintf("a%d", i), home: i % len(e.clients), m: m, e: e, cfg: &cfg,
			rng: rand.New(rand.NewPCG(cfg.seed, uint64(i)+1))}
	}
	inj := &injector{m: m, e: e, cfg: &cfg, rng: rand.New(rand.NewPCG(cfg.seed, 1000))}
	begin := time.Now()
	rounds := 0
	for time.Since(begin) < cfg.duration && !m.stopped() {
		rounds++
		end := time.Now().Add(min(cfg.round, max(cfg.duration-time.Since(begin), 500*time.Millisecond)))
		m.event("ROUND %d until %s", rounds, m.at(end))
		var wg sync.WaitGroup
		for _, a := range actors {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.run(end)
			}()
		}
		faultsDone := make(chan struct{})
		go func() {
			defer close(faultsDone)
			inj.run(end)
		}()
		done := make(chan struct{})
		go func() { wg.Wait(); <-faultsDone; close(done) }()
		hang := 90 * time.Second
		select {
		case <-done:
		case <-time.After(time.Until(end) + hang):
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			m.violation("round %d: its goroutines did not finish within %v of its end (a hang); goroutines:\n%s", rounds, hang, buf)
			fail("hang")
			return
		}
		if m.stopped() {
			break
		}
		if msg := drain(m, e, cfg.timing); msg != "" {
			m.violation("after round %d: %s", rounds, msg)
		}
	}
	// Let the obligations of the last entries come due.
	deadline := time.Now().Add(5 * time.Second)
	for m.pending() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	m.sweep(time.Now())
	if m.stopped() {
		fail(fmt.Sprintf("the model found %d violation(s) in round %d", len(m.violations), rounds))
		return
	}
	close(sweepStop)
	<-sweepDone
	closeAll()
	writeLog()
	m.mu.Lock()
	var counts []string
	for k, v := range m.counts {
		counts = append(counts, fmt.Sprintf("%s=%d", k, v))
	}
	m.mu.Unlock()
	sort.Strings(counts)
	t.Logf("%d rounds in %v, no violation; %s", rounds, time.Since(begin).Round(time.Millisecond), strings.Join(counts, " "))
}

// drain checks, after a round whose goroutines released everything, that
// neither Redis nor any Client keeps anything of it: within two watchdog
// timeouts (what faults may have left in Redis expires by then).
func drain(m *model, e *modelEnv, timing modelTiming) string {
	if left := m.unreleased(); len(left) > 0 {
		return fmt.Sprintf("the test's goroutines left holds unreleased (a bug of the test): %v", left)
	}
	deadline := time.Now().Add(2*timing.lease + 2*time.Second)
	for {
		keys, err := modelKeys(e)
		var holds []string
		for i, c := range e.clients {
			if n := lock.HoldsOf(c); n > 0 {
				holds = append(holds, fmt.Sprintf("client %d: %d %v", i, n, lock.DescribeHolds(c)))
			}
		}
		for i, cs := range e.red {
			for j, c := range cs {
				if n := lock.HoldsOf(c); n > 0 {
					holds = append(holds, fmt.Sprintf("RedLock instance %d node %d: %d", i, j, n))
				}
			}
		}
		if err == nil && len(keys) == 0 && len(holds) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			var desc []string
			for _, k := range keys {
				desc = append(desc, describeKey(e, k))
			}
			return fmt.Sprintf("everything released, yet after %v Redis keeps %v and the Clients keep holds %v (err %v)",
				2*timing.lease+2*time.Second, desc, holds, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// modelKeys returns the keys of the model's locks in Redis, but the token
// counters (which outlive their locks by design).
func modelKeys(e *modelEnv) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var out []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*model:*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			if strings.HasPrefix(k, "redisson_lock_token:") {
				continue
			}
			mu.Lock()
			out = append(out, k)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch a := e.admin.(type) {
	case *redis.ClusterClient:
		err = a.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, a)
	}
	for i, n := range e.redNodes {
		before := len(out)
		if err2 := scan(ctx, n); err2 != nil && err == nil {
			err = err2
		}
		for j := before; j < len(out); j++ {
			out[j] = fmt.Sprintf("RedLock node %d: %s", i, out[j])
		}
	}
	sort.Strings(out)
	return out, err
}

// describeKey shows a key's type, contents and expiry.
func describeKey(e *modelEnv, k string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	typ, _ := e.admin.Type(ctx, k).Result()
	ttl, _ := e.admin.PTTL(ctx, k).Result()
	var val any
	switch typ {
	case "hash":
		val, _ = e.admin.HGetAll(ctx, k).Result()
	case "zset":
		val, _ = e.admin.ZRangeWithScores(ctx, k, 0, -1).Result()
	case "list":
		val, _ = e.admin.LRange(ctx, k, 0, -1).Result()
	case "string":
		val, _ = e.admin.Get(ctx, k).Result()
	}
	return fmt.Sprintf("%s(%s, pttl %v: %v)", k, typ, ttl, val)
}

// errModelCancel is the cause of the contexts the test cancels.
var errModelCancel = errors.New("model: cancelled by the test")

// A kindID is a lock type and the call the test makes on it.
type kindID uint8

const (
	kMutex kindID = iota
	kFair
	kMulti
	kRead
	kWrite
	kPermit
	kRed
)

func (k kindID) String() string {
	return [...]string{"Mutex", "FairMutex", "MultiLock", "RLock", "WLock", "Semaphore", "RedLock"}[k]
}

func (k kindID) role() modelRole {
	switch k {
	case kRead:
		return roleRead
	case kWrite:
		return roleWrite
	case kPermit:
		return rolePermit
	}
	return roleExcl
}

func (k kindID) tokens() bool { return k != kRead && k != kPermit }

// A lockSpec is one acquisition the test makes.
type lockSpec struct {
	kind   kindID
	names  []string
	client int
	lease  time.Duration // fixed lease; 0 = watchdog
	wait   time.Duration // TryLock's wait; < 0 = Lock
}

func (s lockSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%s)@c%d", s.kind, strings.Join(s.names, ","), s.client)
	if s.wait >= 0 {
		fmt.Fprintf(&b, " try %v", s.wait)
	}
	if s.lease > 0 {
		fmt.Fprintf(&b, " lease %v", s.lease)
	}
	return b.String()
}

// An entry is one acquired level on a goroutine's stack.
type entry struct {
	spec    lockSpec
	ctx     context.Context
	holds   []*mhold
	created []bool             // per hold: this acquisition created it
	parent  *entry             // the entry whose context ctx descends from (nil: the request's)
	cancel  context.CancelFunc // the per-call deadline's, if any
}

// chain returns the entries the context on top of the stack all descends
// from, innermost first: the holds it may re-enter. A read hold taken under
// a write hold (a downgrade) descends from the context the write hold was
// taken with, not from the write hold's.
func chain(all []*entry) []*entry {
	var out []*entry
	if len(all) == 0 {
		return nil
	}
	for e := all[len(all)-1]; e != nil; e = e.parent {
		out = append(out, e)
	}
	return out
}

// An actor is one goroutine of the test running random programs: requests,
// each a nest of acquisitions on a context of its own.
type actor struct {
	id    string
	home  int
	m     *model
	e     *modelEnv
	cfg   *modelConfig
	rng   *rand.Rand
	child bool
}

func (a *actor) dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(a.rng.Int64N(int64(hi-lo)))
}

func (a *actor) chance(p float64) bool { return a.rng.Float64() < p }

func (a *actor) run(end time.Time) {
	for time.Now().Before(end) && !a.m.stopped() {
		a.request(end)
	}
}

// request runs one request: a context (Background or cancellable, maybe
// cancelled at a random moment), a few steps, and the release of what is
// left.
func (a *actor) request(end time.Time) {
	req := context.Background()
	if !a.chance(0.2) {
		var cancel context.CancelCauseFunc
		req, cancel = context.WithCancelCause(context.Background())
		defer cancel(nil)
		if a.cfg.mix["cancel"] && a.chance(0.25) {
			timer := time.AfterFunc(a.dur(0, 80*time.Millisecond), func() { cancel(errModelCancel) })
			defer timer.Stop()
		}
	}
	var st []*entry
	steps := 1 + a.rng.IntN(10)
	for i := 0; i < steps && time.Now().Before(end) && !a.m.stopped(); i++ {
		if req.Err() != nil || (len(st) > 0 && st[len(st)-1].ctx.Err() != nil) {
			break
		}
		st = a.step(req, st, nil)
	}
	a.releaseAll(st, req.Err() != nil)
}

// top returns the context the next acquisition is made with.
func top(base context.Context, st []*entry) context.Context {
	if len(st) == 0 {
		return base
	}
	return st[len(st)-1].ctx
}

// step runs one random operation on stack st (parent: the stack of the
// goroutine that forked this one, shared read-only) and returns the stack.
func (a *actor) step(req context.Context, st []*entry, parent []*entry) []*entry {
	all := append(append([]*entry{}, parent...), st...)
	ctx := top(req, all)
	r := a.rng.IntN(100)
	switch {
	case r < 40:
		spec, ok := a.reentrySpec(all)
		if !ok || a.chance(0.5) {
			spec = a.freshSpec(len(all) > 0)
		}
		if e := a.acquire(ctx, spec, all); e != nil {
			st = append(st, e)
		}
	case r < 60:
		if len(st) > 0 {
			a.release(st[len(st)-1])
			st = st[:len(st)-1]
		}
	case r < 76:
		d := a.dur(0, 25*time.Millisecond)
		if a.cfg.mix["long"] && a.chance(0.06) {
			d = a.dur(a.cfg.timing.period, a.cfg.timing.lease+a.cfg.timing.period)
		}
		a.sleep(ctx, d)
	case r < 82:
		if a.cfg.mix["rw"] && len(st) > 0 && !a.child {
			st = a.downgrade(st, all)
		}
	case r < 86:
		if a.cfg.mix["rw"] {
			a.upgrade(ctx, all)
		}
	case r < 94:
		if a.cfg.mix["fanout"] && !a.child {
			a.fanout(req, all)
		}
	}
	return st
}

// sleep works under the locks for d, or until ctx ends.
func (a *actor) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-a.m.stop:
	}
}

// freshSpec draws an acquisition of locks the goroutine does not hold yet
// (or may hold: it is predicted, not assumed). nested says whether the
// goroutine holds something, so it must not wait without bound (lock order
// deadlocks between the test's goroutines are no bug of the engine).
func (a *actor) freshSpec(nested bool) lockSpec {
	e := a.e
	s := lockSpec{client: a.home, wait: -1}
	kinds := []kindID{kMutex, kMutex, kMutex}
	if a.cfg.mix["fair"] {
		kinds = append(kinds, kFair, kFair)
	}
	if a.cfg.mix["multi"] {
		kinds = append(kinds, kMulti, kMulti)
	}
	if a.cfg.mix["rw"] {
		kinds = append(kinds, kRead, kRead, kWrite)
	}
	if a.cfg.mix["sem"] {
		kinds = append(kinds, kPermit, kPermit, kPermit)
	}
	if len(e.red) > 0 {
		kinds = append(kinds, kRed)
	}
	s.kind = kinds[a.rng.IntN(len(kinds))]
	switch s.kind {
	case kMutex, kFair:
		s.names = []string{e.exNames[a.rng.IntN(len(e.exNames))]}
	case kMulti:
		perm := a.rng.Perm(len(e.exNames))
		n := 2 + a.rng.IntN(len(e.exNames)-1)
		for _, i := range perm[:n] {
			s.names = append(s.names, e.exNames[i])
		}
	case kRead, kWrite:
		s.names = []string{e.rwNames[a.rng.IntN(len(e.rwNames))]}
	case kPermit:
		s.names = []string{e.semNames[a.rng.IntN(len(e.semNames))]}
	case kRed:
		s.names = []string{"model:red"}
		s.client = redClient + a.home%len(e.red)
	}
	if a.cfg.mix["lease"] && a.chance(0.15) {
		s.lease = a.dur(50*time.Millisecond, 3*a.cfg.timing.lease/4)
	}
	other := a.cfg.mix["other"] && a.chance(0.1)
	if other {
		s.client = a.rng.IntN(len(e.clients))
		if s.kind == kRed {
			s.client = redClient + a.rng.IntN(len(e.red))
		}
	}
	if nested || other || a.child || a.chance(0.5) {
		s.wait = []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond, 300 * time.Millisecond}[a.rng.IntN(4)]
	}
	return s
}

// reentrySpec draws an acquisition that re-enters a hold of the stack,
// possibly through another kind.
func (a *actor) reentrySpec(all []*entry) (lockSpec, bool) {
	var cands []*mhold
	for _, e := range chain(all) {
		for _, h := range e.holds {
			if e.ctx.Err() == nil {
				cands = append(cands, h)
			}
		}
	}
	if len(cands) == 0 {
		return lockSpec{}, false
	}
	h := cands[a.rng.IntN(len(cands))]
	s := lockSpec{client: h.client, names: []string{h.name}, wait: -1}
	if a.chance(0.5) {
		s.wait = []time.Duration{0, 50 * time.Millisecond}[a.rng.IntN(2)]
	}
	switch h.role {
	case roleExcl:
		if h.client >= redClient {
			s.kind = kRed
			break
		}
		s.kind = []kindID{kMutex, kFair, kMulti}[a.rng.IntN(3)]
		if s.kind == kFair && !a.cfg.mix["fair"] || s.kind == kMulti && !a.cfg.mix["multi"] {
			s.kind = kMutex
		}
		if s.kind == kMulti {
			for _, n := range a.e.exNames {
				if n != h.name && a.chance(0.5) {
					s.names = append(s.names, n)
				}
			}
			a.rng.Shuffle(len(s.names), func(i, j int) { s.names[i], s.names[j] = s.names[j], s.names[i] })
			if len(s.names) > 1 && s.wait < 0 {
				s.wait = 50 * time.Millisecond // it may wait for the other names
			}
		}
	case roleRead:
		s.kind = kRead
	case roleWrite:
		s.kind = kWrite
	case rolePermit:
		s.kind = kPermit
	}
	if a.cfg.mix["release"] && s.kind != kMulti && a.chance(0.1) {
		s.lease = a.dur(50*time.Millisecond, a.cfg.timing.lease)
	}
	return s, true
}

// predict says what the contract makes of spec for a goroutine holding all:
// per name, the hold it re-enters (none: a new hold), the write hold a read
// hold is taken under, and whether it is a refused upgrade.
func (a *actor) predict(spec lockSpec, all []*entry) (grants []grant, upgrade bool) {
	a.m.mu.Lock() // levels change under other goroutines' re-entries
	defer a.m.mu.Unlock()
	anc := chain(all)
	find := func(name string, r modelRole) *mhold {
		for _, e := range anc {
			for _, h := range e.holds {
				if h.client == spec.client && h.name == name && h.role == r && h.levels > 0 {
					return h
				}
			}
		}
		return nil
	}
	for _, n := range spec.names {
		g := grant{name: n, role: spec.kind.role(), permits: a.e.permits[n]}
		switch spec.kind {
		case kRead:
			if g.reenter = find(n, roleRead); g.reenter == nil {
				g.downgrade = find(n, roleWrite)
			}
		case kWrite:
			if g.reenter = find(n, roleWrite); g.reenter == nil && find(n, roleRead) != nil {
				upgrade = true
			}
		default:
			g.reenter = find(n, g.role)
		}
		grants = append(grants, g)
	}
	return grants, upgrade
}

// call makes the acquisition spec with ctx.
func (a *actor) call(ctx context.Context, spec lockSpec) (context.Context, error) {
	var opts []lock.LockOption
	if spec.kind == kRed {
		if spec.lease > 0 {
			opts = append(opts, lock.WithLease(spec.lease))
		}
		r := lock.NewRedLock(spec.names[0], a.e.red[spec.client-redClient]...)
		if spec.wait >= 0 {
			return r.TryLock(ctx, spec.wait, opts...)
		}
		return r.Lock(ctx, opts...)
	}
	c := a.e.clients[spec.client]
	if spec.lease > 0 {
		opts = append(opts, lock.WithLease(spec.lease))
	}
	try := spec.wait >= 0
	switch spec.kind {
	case kMutex:
		if try {
			return c.Mutex(spec.names[0]).TryLock(ctx, spec.wait, opts...)
		}
		return c.Mutex(spec.names[0]).Lock(ctx, opts...)
	case kFair:
		if try {
			return c.FairMutex(spec.names[0]).TryLock(ctx, spec.wait, opts...)
		}
		return c.FairMutex(spec.names[0]).Lock(ctx, opts...)
	case kMulti:
		if try {
			return c.MultiLock(spec.names...).TryLock(ctx, spec.wait, opts...)
		}
		return c.MultiLock(spec.names...).Lock(ctx, opts...)
	case kRead:
		if try {
			return c.RWMutex(spec.names[0]).TryRLock(ctx, spec.wait, opts...)
		}
		return c.RWMutex(spec.names[0]).RLock(ctx, opts...)
	case kWrite:
		if try {
			return c.RWMutex(spec.names[0]).TryLock(ctx, spec.wait, opts...)
		}
		return c.RWMutex(spec.names[0]).Lock(ctx, opts...)
	case kPermit:
		s := c.Semaphore(spec.names[0], a.e.permits[spec.names[0]])
		if try {
			return s.TryAcquire(ctx, spec.wait, opts...)
		}
		return s.Acquire(ctx, opts...)
	}
	panic("unknown kind")
}

// unlockCall releases the level e holds.
func (a *actor) unlockCall(e *entry) error {
	if e.spec.kind == kRed {
		return lock.NewRedLock(e.spec.names[0], a.e.red[e.spec.client-redClient]...).Unlock(e.ctx)
	}
	c := a.e.clients[e.spec.client]
	switch e.spec.kind {
	case kMutex:
		return c.Mutex(e.spec.names[0]).Unlock(e.ctx)
	case kFair:
		return c.FairMutex(e.spec.names[0]).Unlock(e.ctx)
	case kMulti:
		return c.MultiLock(e.spec.names...).Unlock(e.ctx)
	case kRead:
		return c.RWMutex(e.spec.names[0]).RUnlock(e.ctx)
	case kWrite:
		return c.RWMutex(e.spec.names[0]).Unlock(e.ctx)
	case kPermit:
		return c.Semaphore(e.spec.names[0], a.e.permits[e.spec.names[0]]).Release(e.ctx)
	}
	panic("unknown kind")
}

// doneAt reports when ctx ended, once it has; stop unregisters it.
func doneAt(ctx context.Context) (at func() time.Time, stop func()) {
	var mu sync.Mutex
	var t time.Time
	stopf := context.AfterFunc(ctx, func() {
		mu.Lock()
		t = time.Now()
		mu.Unlock()
	})
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return t
	}, func() { stopf() }
}

// acquire makes the acquisition spec with base on top of the stack all,
// checks its outcome against the model, and returns the entry when it
// succeeded.
func (a *actor) acquire(base context.Context, spec lockSpec, all []*entry) *entry {
	grants, upgrade := a.predict(spec, all)
	reentry := !upgrade
	some := false
	for _, g := range grants {
		if g.reenter == nil {
			reentry = false
		} else {
			some = true
		}
	}
	if spec.kind == kMulti && some && !a.cfg.mix["multire"] {
		return nil
	}
	if some && spec.lease > 0 && (!a.cfg.mix["release"] || spec.kind == kMulti || spec.kind == kRed) {
		// A drawn acquisition that turns out to re-enter: without its lease
		// unless re-entries with leases are on (and never for compound
		// locks, whose re-entries' leases the model does not follow).
		spec.lease = 0
	}
	ctx := base
	var cancel context.CancelFunc
	if a.cfg.mix["cancel"] && a.chance(0.1) {
		ctx, cancel = context.WithTimeout(base, a.dur(time.Millisecond, 200*time.Millisecond))
	}
	floors := a.m.tokensBefore(spec.names)
	baseTok, _ := fencing.FromContext(ctx)
	ended, stopEnded := doneAt(ctx)
	a.m.event("%s %s called", a.id, spec)
	called := time.Now()
	out, err := a.call(ctx, spec)
	returned := time.Now()
	stopEnded()
	class := errorClass(err)
	a.m.count(spec.kind.String() + ":" + class)
	what := fmt.Sprintf("%s %s", a.id, spec)
	if err != nil {
		if cancel != nil {
			cancel()
		}
		endedAt := ended()
		a.m.event("%s -> %s (%v) in %v", what, class, err, returned.Sub(called).Round(time.Microsecond))
		switch {
		case class == "unexpected":
			a.m.violation("%s: unexpected error %v", what, err)
		case upgrade && class != "upgrade" && class != "ctx" && class != "net" && class != "lost":
			a.m.violation("%s: an upgrade from a held read lock answered %v, want ErrUpgrade", what, err)
		case !upgrade && class == "upgrade" && !a.anyTold(grants):
			// (A write hold found gone when re-entered leaves the read hold
			// of a downgrade alone: then the answer is ErrUpgrade.)
			a.m.violation("%s: ErrUpgrade without a read hold of its own", what)
		case class == "busy" && spec.wait < 0:
			a.m.violation("%s: Lock without a bound answered ErrNotAcquired", what)
		case class == "busy" && !endedAt.IsZero() && endedAt.Before(called.Add(spec.wait)) && returned.Sub(endedAt) > 2*a.cfg.timing.grace:
			// (A context that ended after the wait ran out, while the call
			// was still held up in the network, may get either answer.)
			a.m.violation("%s: ErrNotAcquired for a caller whose context had ended %v before, within its wait", what, returned.Sub(endedAt))
		case class == "busy" && reentry && !a.anyTold(grants):
			a.m.violation("%s: a re-entry of holds it has was refused as busy", what)
		}
		a.checkWait(what, spec, called, returned)
		return nil
	}
	a.checkWait(what, spec, called, returned)
	if upgrade {
		a.m.violation("%s: an upgrade from a held read lock succeeded", what)
	}
	issues := spec.kind.tokens()
	if reentry {
		issues = false
		if spec.kind == kMulti { // a compound lock may issue a token of its own over held locks
			tok, _ := fencing.FromContext(out)
			issues = tok != baseTok
			for _, g := range grants {
				if g.reenter.token == tok {
					issues = false
				}
			}
		}
	}
	holds := a.m.entered(a.id, spec.client, spec.String(), out, called, returned, grants, floors, issues, spec.lease, spec.kind != kMulti)
	for i, h := range holds {
		if grants[i].reenter == nil {
			context.AfterFunc(h.ctx, func() { a.m.told(h, time.Now(), context.Cause(h.ctx)) })
		}
	}
	e := &entry{spec: spec, ctx: out, holds: holds, cancel: cancel}
	if len(all) > 0 {
		e.parent = all[len(all)-1]
	}
	for _, g := range grants {
		e.created = append(e.created, g.reenter == nil)
		if g.downgrade != nil {
			for p := e.parent; p != nil; p = p.parent {
				for j, h := range p.holds {
					if h == g.downgrade && p.created[j] {
						e.parent = p.parent
					}
				}
			}
		}
	}
	return e
}

// checkWait checks that a TryLock returned within its wait, unless the
// network was disturbed meanwhile (a call under way then waits for its
// own timeout). The bound allows for a loaded machine, not for waiting
// behind another goroutine's wait.
func (a *actor) checkWait(what string, spec lockSpec, called, returned time.Time) {
	if spec.wait < 0 {
		return
	}
	took := returned.Sub(called)
	if bound := spec.wait + time.Second; took > bound && a.m.quiet(called, returned, 5*time.Second) {
		a.m.violation("%s: took %v, more than its wait and %v", what, took, bound-spec.wait)
	}
}

// anyTold reports whether one of the holds the grants re-enter has been told.
func (a *actor) anyTold(grants []grant) bool {
	for _, g := range grants {
		if g.reenter != nil && g.reenter.ctx.Err() != nil {
			return true
		}
	}
	return false
}

// release unlocks e's level, retrying while the network fails it.
func (a *actor) release(e *entry) {
	what := fmt.Sprintf("%s unlock %s", a.id, e.spec)
	alive := e.ctx.Err() == nil
	a.m.releasing(a.id, e.spec.String(), e.holds, time.Now())
	deadline := time.Now().Add(3 * time.Second)
	for attempt := 0; ; attempt++ {
		err := a.unlockCall(e)
		class := errorClass(err)
		a.m.count("unlock:" + class)
		if err != nil {
			a.m.event("%s -> %s (%v)", what, class, err)
		}
		switch {
		case class == "unexpected":
			a.m.violation("%s: unexpected error %v", what, err)
		case class == "not-held" && attempt == 0 && alive && e.ctx.Err() == nil:
			a.m.violation("%s: ErrNotHeld for a level its context holds", what)
		case class == "net" && time.Now().Before(deadline) && !a.m.stopped():
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	if e.cancel != nil {
		e.cancel()
	}
	a.checkHoldCount(e)
}

// checkHoldCount checks that a Mutex or FairMutex level whose hold has been
// released answers HoldCount with 0 (and no error): its context ended with
// the release, which must not make the question fail.
func (a *actor) checkHoldCount(e *entry) {
	if e.spec.kind != kMutex && e.spec.kind != kFair || a.m.levels(e.holds[0]) > 0 {
		return
	}
	c := a.e.clients[e.spec.client]
	n, err := c.Mutex(e.spec.names[0]).HoldCount(e.ctx)
	if class := errorClass(err); class != "net" && (err != nil || n != 0) {
		a.m.violation("%s: HoldCount after the final Unlock = %d, %v; want 0", a.id, n, err)
	}
}

// releaseAll releases the stack, innermost first. A request whose context
// ended may leave its holds to end with it, when the contract says so.
func (a *actor) releaseAll(st []*entry, ended bool) {
	skip := ended && a.cfg.mix["lifetime"] && a.chance(0.5)
	for i := len(st) - 1; i >= 0; i-- {
		e := st[i]
		if skip {
			a.m.releasing(a.id, e.spec.String()+" (left to its context's end)", e.holds, time.Now())
			if e.cancel != nil {
				e.cancel()
			}
			continue
		}
		a.release(e)
	}
}

// downgrade takes the read lock under the write lock on top of the stack
// and then releases the write lock: the read hold must outlive it.
func (a *actor) downgrade(st []*entry, all []*entry) []*entry {
	w := st[len(st)-1]
	if w.spec.kind != kWrite || w.ctx.Err() != nil {
		return st
	}
	spec := lockSpec{kind: kRead, names: w.spec.names, client: w.spec.client, wait: 0}
	r := a.acquire(w.ctx, spec, all)
	if r == nil {
		return st
	}
	a.release(w)
	st = append(st[:len(st)-1], r)
	if cause := context.Cause(r.ctx); r.ctx.Err() != nil && errors.Is(cause, lock.ErrReleased) {
		a.m.violation("%s: the read hold of a downgrade ended with the write lock's release (%v)", a.id, cause)
	}
	return st
}

// upgrade asks for the write lock while holding the read lock: ErrUpgrade.
func (a *actor) upgrade(ctx context.Context, all []*entry) {
	for _, e := range chain(all) {
		for _, h := range e.holds {
			if h.role == roleRead && a.m.levels(h) > 0 && e.ctx.Err() == nil {
				spec := lockSpec{kind: kWrite, names: []string{h.name}, client: h.client, wait: 100 * time.Millisecond}
				if e := a.acquire(ctx, spec, all); e != nil {
					a.release(e)
				}
				return
			}
		}
	}
}

// fanout runs a few goroutines that share the top of the stack as their
// context: they re-enter its holds (sharing them) and, with mix "fresh",
// take locks of their own, which must exclude each other.
func (a *actor) fanout(req context.Context, all []*entry) {
	n := 2 + a.rng.IntN(2)
	same := a.chance(0.5) // every child goes for the same lock
	var shared lockSpec
	if same {
		shared = a.freshSpec(true)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		child := &actor{id: fmt.Sprintf("%s/%d", a.id, i), home: a.home, m: a.m, e: a.e, cfg: a.cfg, child: true,
			rng: rand.New(rand.NewPCG(a.rng.Uint64(), a.rng.Uint64()))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st []*entry
			for s := 0; s < 1+child.rng.IntN(3) && !child.m.stopped(); s++ {
				mine := append(append([]*entry{}, all...), st...)
				ctx := top(req, mine)
				if ctx.Err() != nil {
					break
				}
				// The holds ctx carries: a downgrade of the child's own
				// (a read hold taken under a write hold) descends from the
				// write hold's parent, not from the holds above it in all.
				spec, ok := child.reentrySpec(mine)
				if a.cfg.mix["fresh"] && (!ok || child.chance(0.6)) {
					spec = child.freshSpec(true)
					if same {
						spec = shared
					}
				} else if !ok {
					break
				}
				if e := child.acquire(ctx, spec, mine); e != nil {
					st = append(st, e)
					child.sleep(e.ctx, child.dur(0, 5*time.Millisecond))
				}
			}
			child.releaseAll(st, false)
		}()
	}
	wg.Wait()
}

// An injector applies the run's faults, one at a time with calm between.
type injector struct {
	m   *model
	e   *modelEnv
	cfg *modelConfig
	rng *rand.Rand
}

func (f *injector) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(f.rng.Int64N(int64(hi-lo)+1))
}

func (f *injector) wait(end time.Time, d time.Duration) bool {
	d = min(d, time.Until(end))
	if d <= 0 {
		return false
	}
	select {
	case <-time.After(d):
		return true
	case <-f.m.stop:
		return false
	}
}

// run applies faults until end and heals everything before returning.
func (f *injector) run(end time.Time) {
	e := f.e
	var kinds []string
	for _, k := range []string{"net", "cutoff", "delete", "rollback", "restart"} {
		if f.cfg.mix[k] && (k != "restart" || e.srv != nil) && (k != "net" && k != "cutoff" || e.proxies[0] != nil) {
			kinds = append(kinds, k)
		}
	}
	for len(kinds) > 0 && f.wait(end, f.dur(300*time.Millisecond, time.Second)) {
		k := kinds[f.rng.IntN(len(kinds))]
		if k == "restart" && f.rng.IntN(4) != 0 {
			k = "delete" // restarts are the slowest fault: rarer
		}
		switch k {
		case "net":
			i := f.rng.IntN(len(e.proxies) + 1)
			if i >= len(e.proxies) {
				i = 0 // the Client without go-redis's retries: twice as often
			}
			p := e.proxies[i]
			if p == nil {
				continue
			}
			d := f.dur(100*time.Millisecond, 800*time.Millisecond)
			w := f.m.netFault(-1, time.Now())
			switch f.rng.IntN(3) {
			case 0:
				lat := f.dur(time.Millisecond, 30*time.Millisecond)
				f.m.event("FAULT latency %v on client %d for %v", lat, i, d)
				p.SetLatency(lat)
				f.wait(end, d)
				p.SetLatency(0)
			case 1:
				rate := 0.02 + f.rng.Float64()*0.15
				f.m.event("FAULT reset rate %.3f on client %d for %v", rate, i, d)
				p.SetResetRate(rate)
				f.wait(end, d)
				p.SetResetRate(0)
			case 2:
				f.m.event("FAULT reset all connections of client %d", i)
				p.ResetAll()
			}
			f.m.netFault(w, time.Now())
			f.m.event("FAULT healed on client %d", i)
		case "cutoff":
			i := f.rng.IntN(len(e.proxies))
			p := e.proxies[i]
			if p == nil {
				continue
			}
			d := f.dur(100*time.Millisecond, 3*f.cfg.timing.lease/2)
			f.m.event("FAULT client %d cut off for %v", i, d)
			w := f.m.netFault(-1, time.Now())
			p.SetBlackhole(true)
			f.wait(end, d)
			p.SetBlackhole(false)
			f.m.netFault(w, time.Now())
			f.m.event("FAULT client %d reconnected", i)
		case "delete":
			names := e.allNames()
			if len(e.redNodes) > 0 {
				names = append(names, "model:red")
			}
			name := names[f.rng.IntN(len(names))]
			after := f.cfg.timing.period + f.cfg.timing.slack
			from := time.Now()
			// Announced before it happens (an entry may follow at once),
			// bounded by the call's timeout, and again once it is done.
			f.m.doom([]string{name}, from, from.Add(2*time.Second), after, "key to be deleted")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var err error
			if name == "model:red" { // on a majority of the RedLock's nodes
				for _, i := range f.rng.Perm(len(e.redNodes))[:len(e.redNodes)/2+1] {
					if err2 := e.redNodes[i].Del(ctx, name).Err(); err2 != nil {
						err = err2
					}
				}
			} else if _, sem := e.permits[name]; sem {
				err = e.admin.Del(ctx, name, permitsKey(name)).Err() // the count and the permits
			} else {
				err = e.admin.Del(ctx, name).Err()
			}
			cancel()
			to := time.Now()
			if err != nil {
				f.m.event("FAULT delete %s failed: %v", name, err)
			}
			f.m.doom([]string{name}, from, to, after, "key deleted")
		case "rollback":
			names := append(append([]string{}, e.exNames...), e.rwNames...)
			name := names[f.rng.IntN(len(names))]
			counter := "redisson_lock_token:{" + name + "}"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v, err := rollbackScript.Run(ctx, e.admin, []string{counter}, f.rng.IntN(2), 1+f.rng.IntN(1000000)).Int64()
			cancel()
			f.m.event("FAULT token counter of %s rolled back: was %d (-1: ahead of the clock, left alone), err %v", name, v, err)
		case "restart":
			after := f.cfg.timing.lease + f.cfg.timing.slack
			from := time.Now()
			f.m.doom(e.allNames(), from, from.Add(10*time.Second), after, "Redis to be restarted")
			w := f.m.netFault(-1, from)
			e.srv.Restart()
			f.m.netFault(w, time.Now())
			f.m.doom(e.allNames(), from, time.Now(), after, "Redis restarted")
		}
	}
}

// rollbackScript moves a token counter back (ARGV[1] 1: deletes it; 0:
// subtracts ARGV[2]), as a failover to a replica that missed the last
// tokens, or a counter that expired, would. It does so only while the
// counter is below the server's clock in microseconds: the contract promises
// increasing tokens across such a loss only then (tokens follow the clock).
// It returns the counter's value, or -1 when it left it alone.
var rollbackScript = redis.NewScript(`
local c = tonumber(redis.call('get', KEYS[1]) or '0')
local t = redis.call('time')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if c >= now - 1000 then return -1 end
if ARGV[1] == '1' then
  redis.call('del', KEYS[1])
else
  redis.call('set', KEYS[1], string.format('%.0f', math.max(c - tonumber(ARGV[2]), 0)), 'keepttl')
end
return c
`)
