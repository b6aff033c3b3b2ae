package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/lock"
)

// A contender is one lock library under test, configured one way.
type contender struct {
	name   string // row label
	config string // how it is configured, printed under the tables
	peer   bool   // a peer library: the targets compare this framework's Mutex with peers (the floors are not)
	// uncontendedOnly marks a reference that runs only in the uncontended
	// scenario: under contention it would only spin.
	uncontendedOnly bool
	open            func(rdb *redis.Client) instance
}

// An instance is what one service instance (one process) creates once for a
// contender: a lock client over its own Redis connection pool.
type instance interface {
	// mutex returns a handle on the lock called name for one goroutine.
	mutex(name string) mutex
	close()
}

// A mutex is one goroutine's handle on one lock.
type mutex interface {
	// lock waits until the lock is acquired or ctx ends.
	lock(ctx context.Context) error
	// unlock releases the lock this handle acquired last.
	unlock() error
}

// Peer configurations, stated in the report.
const (
	tunedDelayMin = 2 * time.Millisecond  // redsync, tuned: uniform random retry delay from...
	tunedDelayMax = 10 * time.Millisecond // ...to
	rampStart     = 10 * time.Millisecond // redislock: first retry after...
	rampStep      = 10 * time.Millisecond // ...then this much longer each time...
	rampMax       = 50 * time.Millisecond // ...up to
	fixedTTL      = 30 * time.Second      // redislock and the floor: the lease (no watchdog)
)

// contenders returns the libraries in the order the tables list them.
func contenders() []contender {
	return []contender{
		{
			name:   "seckillguard",
			config: "lock.Mutex, defaults: watchdog 30 s (renewal every 10 s), waiting pushed by pub/sub, FIFO per Client",
			open:   openOurs,
		},
		{
			name:   "seckillguard (fair)",
			config: "lock.FairMutex, defaults: one line in Redis across every Client, an unlock wakes exactly the next waiter",
			open:   openOursFair,
		},
		{
			name:   "redsync (defaults)",
			config: "go-redsync/redsync/v4, one goredis/v9 pool; defaults (expiry 8 s, retry delay uniform random 50–250 ms) except tries unlimited (the default 32 gives up with ErrFailed after about 5 s)",
			peer:   true,
			open:   func(rdb *redis.Client) instance { return openRedsync(rdb, nil) },
		},
		{
			name:   "redsync (tuned)",
			config: fmt.Sprintf("as above, retry delay uniform random %v–%v", tunedDelayMin, tunedDelayMax),
			peer:   true,
			open: func(rdb *redis.Client) instance {
				return openRedsync(rdb, []redsync.Option{redsync.WithRetryDelayFunc(func(int) time.Duration {
					return tunedDelayMin + rand.N(tunedDelayMax-tunedDelayMin)
				})})
			},
		},
		{
			name: "bsm/redislock",
			config: fmt.Sprintf("bsm/redislock, TTL %v, retry strategy: linear backoff %v, +%v per retry, capped at %v",
				fixedTTL, rampStart, rampStep, rampMax),
			peer: true,
			open: openRedislock,
		},
		{
			name:   "floor",
			config: "one EVALSHA to take (SET NX PX in a script), one to release (compare and DEL in a script), retried at once while taken: the least any lock can do per uncontended acquisition; under contention it spins",
			open:   openFloor,
		},
		{
			name:            "floor (Redisson)",
			config:          "the floor's two script calls in Redisson's layout and nothing else: the reentrant hash (EXISTS, HINCRBY, PEXPIRE), and on release HDEL and the unlock message (PUBLISH); no fencing token. What a lock Redisson's clients can share costs at least. Uncontended scenario only",
			uncontendedOnly: true,
			open:            func(rdb *redis.Client) instance { return openLayoutFloor(rdb, redissonTake) },
		},
		{
			name:            "floor (contract)",
			config:          "as floor (Redisson), plus the fencing token this framework issues on every first acquisition (docs/LOCKS.md) (TIME and the counter's SET … GET). No reentrancy bookkeeping, watchdog, context or retry: the least any implementation of this framework's contract costs. Uncontended scenario only",
			uncontendedOnly: true,
			open:            func(rdb *redis.Client) instance { return openLayoutFloor(rdb, contractTake) },
		},
		{
			name:            "floor (scripts, context)",
			config:          "the Mutex's own two scripts (lock/scripts/acquire.lua and release.lua, read from the source tree) with the arguments the Mutex sends, and the least Go bookkeeping a hold of this framework's contract needs: a field per acquisition, a cancellable context carrying the hold and its fencing token, and a registration under a mutex that a watchdog could renew (made on Lock, removed on Unlock). No reentrancy, queue, observer or retry. What is left of the Mutex's cost over it is the rest of its own code. Uncontended scenario only",
			uncontendedOnly: true,
			open:            openLeanFloor,
		},
	}
}

// lockers returns the contenders that run under contention.
func lockers(cs []contender) []contender {
	var out []contender
	for _, c := range cs {
		if !c.uncontendedOnly {
			out = append(out, c)
		}
	}
	return out
}

// ---- this framework ----

type oursInstance struct{ c *lock.Client }

func openOurs(rdb *redis.Client) instance {
	return oursInstance{lock.New(rdb, lock.WithLogger(slog.New(slog.DiscardHandler)))}
}

func (i oursInstance) mutex(name string) mutex { return &oursMutex{m: i.c.Mutex(name)} }
func (i oursInstance) close()                  { _ = i.c.Close() }

type oursMutex struct {
	m    *lock.Mutex
	held context.Context
}

func (m *oursMutex) lock(ctx context.Context) error {
	held, err := m.m.Lock(ctx)
	if err != nil {
		return err
	}
	m.held = held
	return nil
}

func (m *oursMutex) unlock() error { return m.m.Unlock(m.held) }

type oursFairInstance struct{ c *lock.Client }

func openOursFair(rdb *redis.Client) instance {
	return oursFairInstance{lock.New(rdb, lock.WithLogger(slog.New(slog.DiscardHandler)))}
}

func (i oursFairInstance) mutex(name string) mutex { return &oursFairMutex{m: i.c.FairMutex(name)} }
func (i oursFairInstance) close()                  { _ = i.c.Close() }

type oursFairMutex struct {
	m    *lock.FairMutex
	held context.Context
}

func (m *oursFairMutex) lock(ctx context.Context) error {
	held, err := m.m.Lock(ctx)
	if err != nil {
		return err
	}
	m.held = held
	return nil
}

func (m *oursFairMutex) unlock() error { return m.m.Unlock(m.held) }

// ---- go-redsync ----

type redsyncInstance struct {
	rs   *redsync.Redsync
	opts []redsync.Option
}

func openRedsync(rdb *redis.Client, opts []redsync.Option) instance {
	opts = append([]redsync.Option{redsync.WithTries(math.MaxInt32)}, opts...)
	return redsyncInstance{rs: redsync.New(goredis.NewPool(rdb)), opts: opts}
}

func (i redsyncInstance) mutex(name string) mutex {
	return &redsyncMutex{m: i.rs.NewMutex(name, i.opts...)}
}
func (i redsyncInstance) close() {}

type redsyncMutex struct{ m *redsync.Mutex }

func (m *redsyncMutex) lock(ctx context.Context) error {
	for {
		err := m.m.LockContext(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Tries are unlimited; an error here is a Redis error. Keep waiting,
		// as a caller that must have the lock would.
	}
}

func (m *redsyncMutex) unlock() error {
	ok, err := m.m.UnlockContext(context.Background())
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}

// ---- bsm/redislock ----

type redislockInstance struct{ c *redislock.Client }

func openRedislock(rdb *redis.Client) instance { return redislockInstance{redislock.New(rdb)} }

func (i redislockInstance) mutex(name string) mutex { return &redislockMutex{c: i.c, key: name} }
func (i redislockInstance) close()                  {}

type redislockMutex struct {
	c   *redislock.Client
	key string
	l   *redislock.Lock
}

// ramp is the linear backoff given to redislock: rampStart, then rampStep
// longer each retry, capped at rampMax. One per Obtain call.
type ramp struct{ next time.Duration }

// NextBackoff implements redislock.RetryStrategy.
func (r *ramp) NextBackoff() time.Duration {
	if r.next == 0 {
		r.next = rampStart
	}
	d := r.next
	r.next = min(r.next+rampStep, rampMax)
	return d
}

func (m *redislockMutex) lock(ctx context.Context) error {
	for {
		l, err := m.c.Obtain(ctx, m.key, fixedTTL, &redislock.Options{RetryStrategy: &ramp{}})
		if err == nil {
			m.l = l
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Obtain gives up after one TTL when ctx has no deadline; a caller
		// that must have the lock asks again.
	}
}

func (m *redislockMutex) unlock() error { return m.l.Release(context.Background()) }

// ---- the floor ----

// floorTake and floorRelease are the least a Redis lock can send: one script
// call to take, one to release, each one round trip.
var (
	floorTake    = redis.NewScript(`if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0`)
	floorRelease = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
)

var floorSeq atomic.Int64

type floorInstance struct {
	rdb *redis.Client
	id  string
	seq atomic.Int64
}

func openFloor(rdb *redis.Client) instance {
	return &floorInstance{rdb: rdb, id: strconv.FormatInt(floorSeq.Add(1), 10) + ":"}
}

func (i *floorInstance) mutex(name string) mutex {
	return &floorMutex{i: i, keys: []string{name}}
}
func (i *floorInstance) close() {}

type floorMutex struct {
	i     *floorInstance
	keys  []string
	value string
}

var floorTTL = strconv.FormatInt(fixedTTL.Milliseconds(), 10)

func (m *floorMutex) lock(ctx context.Context) error {
	v := m.i.id + strconv.FormatInt(m.i.seq.Add(1), 10)
	for {
		n, err := floorTake.Run(ctx, m.i.rdb, m.keys, v, floorTTL).Int()
		if err == nil && n == 1 {
			m.value = v
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (m *floorMutex) unlock() error {
	n, err := floorRelease.Run(context.Background(), m.i.rdb, m.keys, m.value).Int()
	if err == nil && n != 1 {
		err = errors.New("floor: not held")
	}
	return err
}

// ---- the Redisson and contract floors ----

var (
	//go:embed redisson_take.lua
	redissonTakeSrc string
	//go:embed contract_take.lua
	contractTakeSrc string
	//go:embed contract_release.lua
	contractReleaseSrc string

	redissonTake    = redis.NewScript(redissonTakeSrc)
	contractTake    = redis.NewScript(contractTakeSrc)
	contractRelease = redis.NewScript(contractReleaseSrc)
)

type layoutInstance struct {
	rdb   *redis.Client
	take  *redis.Script // redissonTake or contractTake
	owner string        // Redisson's field: "<instance id>:<thread id>"
}

func openLayoutFloor(rdb *redis.Client, take *redis.Script) instance {
	return &layoutInstance{rdb: rdb, take: take, owner: "layout-floor-" + strconv.FormatInt(floorSeq.Add(1), 10) + ":1"}
}

func (i *layoutInstance) mutex(name string) mutex {
	take, release := layoutKeys(name)
	return &layoutMutex{i: i, take: take, release: release}
}

// layoutKeys returns the keys of Redisson's RLock layout for a lock called
// name: those its acquisition touches (the lock hash, the token counter)
// and those its release does (the hash, the unlock channel).
func layoutKeys(name string) (take, release []string) {
	return []string{name, "redisson_lock_token:{" + name + "}"}, []string{name, "redisson_lock__channel:{" + name + "}"}
}
func (i *layoutInstance) close() {}

type layoutMutex struct {
	i             *layoutInstance
	take, release []string
}

func (m *layoutMutex) lock(ctx context.Context) error {
	for {
		n, err := m.i.take.Run(ctx, m.i.rdb, m.take, m.i.owner, floorTTL).Int64()
		if err == nil && n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (m *layoutMutex) unlock() error {
	n, err := contractRelease.Run(context.Background(), m.i.rdb, m.release, m.i.owner).Int()
	if err == nil && n != 1 {
		err = errors.New("layout floor: not held")
	}
	return err
}

// ---- the lean floor: the lock's scripts and the least Go bookkeeping ----

var (
	leanAcquire = redis.NewScript(lockScript("acquire.lua"))
	leanRelease = redis.NewScript(lockScript("release.lua"))
)

// lockScript returns the text of the lock package's script name, read from
// the source tree (the bench runs from bench/), as lock assembles a script
// that names no library.
func lockScript(name string) string {
	b, err := os.ReadFile(filepath.Join("..", "lock", "scripts", name))
	if err != nil {
		panic("bench: the lean floor needs the lock package's scripts: " + err.Error())
	}
	return string(b) + "\n"
}

type leanInstance struct {
	rdb *redis.Client
	id  string // "<instance id>:", the owner field's prefix
	seq atomic.Int64

	mu   sync.Mutex
	held map[*leanHold]struct{} // what a watchdog would renew
}

type leanHold struct {
	field string
	ctx   context.Context
	end   context.CancelCauseFunc
}

type leanKey struct{}

func openLeanFloor(rdb *redis.Client) instance {
	return &leanInstance{rdb: rdb, id: "lean-floor-" + strconv.FormatInt(floorSeq.Add(1), 10) + ":", held: make(map[*leanHold]struct{})}
}

func (i *leanInstance) mutex(name string) mutex {
	take, release := layoutKeys(name)
	return &leanMutex{i: i, take: take, release: release}
}
func (i *leanInstance) close() {}

type leanMutex struct {
	i             *leanInstance
	take, release []string
	ctx           context.Context // the last Lock's, which unlock releases
}

func (m *leanMutex) lock(ctx context.Context) error {
	h := &leanHold{field: m.i.id + strconv.FormatInt(m.i.seq.Add(1), 10)}
	for {
		tok, err := leanAcquire.Run(ctx, m.i.rdb, m.take, "30000", h.field, 0, "86400000").Int64()
		if err == nil && tok > 0 {
			hctx, end := context.WithCancelCause(ctx)
			h.ctx, h.end = fencing.WithToken(context.WithValue(hctx, leanKey{}, h), fencing.Token(tok)), end
			m.i.mu.Lock()
			m.i.held[h] = struct{}{}
			m.i.mu.Unlock()
			m.ctx = h.ctx
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (m *leanMutex) unlock() error {
	h := m.ctx.Value(leanKey{}).(*leanHold)
	n, err := leanRelease.Run(context.WithoutCancel(h.ctx), m.i.rdb, m.release, h.field, 1, "publish").Int64()
	m.i.mu.Lock()
	delete(m.i.held, h)
	m.i.mu.Unlock()
	h.end(errors.New("lean floor: released"))
	if err == nil && n != 0 {
		err = errors.New("lean floor: not held")
	}
	return err
}
