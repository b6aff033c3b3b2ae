// Package guard is the Gin middleware of seckillguard: it keeps every
// instance of a service from doing the same thing twice.
//
//	g := guard.New(rdb)                        // one per process
//	guard.SetDefault(g)
//	r.POST("/api/seckill/:sku", guard.Lock("sku:<sku>"), buy)
//	r.POST("/api/pay", g.Idempotent(guard.Scope("<ctx:user_id>")), pay)
//
// Lock serialises requests per business key across instances: it derives
// the key from the request, waits a bounded time for the distributed lock,
// answers 429 when it is busy, runs the handler holding the lock (renewed by
// the watchdog), and releases it afterwards, also when the handler panics.
// The handler's request context carries the lock: database writes made with
// it are fenced (package gormplugin), and it is cancelled if the lock is
// lost.
//
// Idempotent gives an endpoint one effect per Idempotency-Key: a retry or a
// double click gets the first answer replayed instead of running the handler
// again.
//
// Both are configured per route with options or from one YAML file
// (LoadPolicies, Guard.Policies), and compose in any order: Lock, Idempotent
// and Combining give a request the same answer and store the same record
// whichever runs first. Every answer of the framework is JSON of the form
// {"error": "<code>", ...}, from one table (the README's). A handler reports
// a write refused as stale with AbortStale. WithNamespace puts one namespace
// in front of every key a Guard writes.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
)

// A Guard holds what the middleware of one service shares: the Redis
// client, the lock Client (with its watchdog), the namespace of every key it
// writes and the metrics. Create one per process with New, install it with
// SetDefault for the package-level middleware, and Close it on shutdown.
type Guard struct {
	rdb      redis.UniversalClient
	locks    *lock.Client
	keeper   *keeper // renews the in-progress markers of idempotent requests
	log      *slog.Logger
	render   ginmw.Renderer // nil: ginmw's default
	defaults []RouteOption
	metrics  *metrics
	hook     StepHook // nil: none
	// recordPrefix starts the Redis key of every idempotency record: the
	// namespace applied by the lock Client's own Key, the one place it is
	// applied.
	recordPrefix string
}

// New returns a Guard on rdb (a single-node, Sentinel failover or Cluster
// client). It does no I/O: call Ping at boot to find a wrong address there
// rather than in the first requests' answers. New panics when rdb is nil (a
// Guard without Redis is a mistake to find at boot), with the error of an
// invalid WithDefaults option, with the error (lock.ErrInvalid) of a lock
// Client that WithLockOptions makes unusable (a lock.WithNamespace with a
// brace, a lock.WithWatchdogTimeout under 30ms), and on a namespace that
// WithNamespace refuses or that differs from the lock.WithNamespace given
// to WithLockOptions.
func New(rdb redis.UniversalClient, opts ...Option) *Guard {
	if rdb == nil {
		panic("guard: New needs a Redis client")
	}
	o := options{log: slog.Default()}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.nsSet && strings.ContainsAny(o.namespace, "{}") {
		panic(fmt.Errorf("guard: WithNamespace(%q): a namespace may not contain \"{\" or \"}\" (they would move a lock's keys to another Cluster slot than its derived ones)", o.namespace))
	}
	m := newMetrics(o.lockMetrics)
	// The Guard's lock events feed its lock metrics; a WithObserver among
	// o.lockOpts is told of them too. The namespace comes first, so that a
	// lock.WithNamespace among o.lockOpts shows through and a difference
	// is found below.
	lockOpts := []lock.Option{lock.WithLogger(o.log), lock.WithObserver(m.locks.Observe)}
	if o.nsSet {
		lockOpts = append(lockOpts, lock.WithNamespace(o.namespace))
	}
	locks := lock.New(rdb, append(lockOpts, o.lockOpts...)...)
	if err := locks.Err(); err != nil {
		panic(fmt.Errorf("guard: WithLockOptions: %w", err))
	}
	if o.nsSet && locks.Namespace() != o.namespace {
		panic(fmt.Errorf("guard: WithNamespace(%q) and lock.WithNamespace(%q) in WithLockOptions differ; set the namespace once", o.namespace, locks.Namespace()))
	}
	r := defaultRoute()
	if applyOptions(&r, useBoth, o.defaults); len(r.errs) > 0 {
		panic(fmt.Errorf("guard: WithDefaults: %w", errors.Join(r.errs...)))
	}
	return &Guard{
		rdb:          rdb,
		locks:        locks,
		keeper:       newKeeper(rdb, o.log),
		log:          o.log,
		render:       o.render,
		defaults:     o.defaults,
		metrics:      m,
		hook:         o.hook,
		recordPrefix: locks.Key(recordPrefix),
	}
}

// Namespace returns the namespace in front of every key the Guard writes
// (WithNamespace, or lock.WithNamespace in WithLockOptions), "" for none.
func (g *Guard) Namespace() string { return g.locks.Namespace() }

// Ping checks that the Guard's Redis answers, for a service to call once at
// boot: New does no I/O, so a wrong address or a server that is down would
// otherwise show only in the answers of the first requests (503, after the
// Redis client's dial retries). The error wraps the Redis client's.
func (g *Guard) Ping(ctx context.Context) error {
	if err := g.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("guard: Redis does not answer: %w", err)
	}
	return nil
}

// Locks returns the Guard's lock Client, for handlers that take further
// locks: locking a name the request already holds, with the request's
// context, re-enters it.
func (g *Guard) Locks() *lock.Client { return g.locks }

// Close stops the Guard's lock Client (its watchdog and subscriptions) and
// the renewal of idempotency keys in progress. Requests still running lose
// their locks' and keys' renewal; close after the HTTP server has drained.
func (g *Guard) Close() error {
	g.keeper.close()
	return g.locks.Close()
}

var defaultGuard atomic.Pointer[Guard]

// SetDefault makes g the Guard of the package-level Lock and Idempotent.
func SetDefault(g *Guard) { defaultGuard.Store(g) }

// Default returns the Guard set with SetDefault, or nil.
func Default() *Guard { return defaultGuard.Load() }

func mustDefault(what string) *Guard {
	g := Default()
	if g == nil {
		panic(fmt.Sprintf("guard: %s needs a default Guard: call guard.SetDefault(guard.New(rdb)) before registering routes", what))
	}
	return g
}

// Lock is Default().Lock: the lock middleware of the default Guard. It
// panics at registration when no default Guard is set.
func Lock(template string, opts ...RouteOption) gin.HandlerFunc {
	return mustDefault("guard.Lock").Lock(template, opts...)
}

// Idempotent is Default().Idempotent. It panics at registration when no
// default Guard is set.
func Idempotent(opts ...RouteOption) gin.HandlerFunc {
	return mustDefault("guard.Idempotent").Idempotent(opts...)
}

// gin context keys of what the middleware publishes to handlers.
const (
	idemKeyName = "seckillguard.idempotency.record"
	idemFPName  = "seckillguard.idempotency.fingerprint"
)

// Key returns the lock key the Lock middleware resolved for this request
// (e.g. "sku:42"), or "" outside a guarded route: the name as the route's
// template made it, which a handler may pass back to the Guard's lock
// Client (Locks) to re-enter the lock. RedisKey is the same key with the
// Guard's namespace, as Redis, the logs and the inspector show it.
func Key(c *gin.Context) string {
	if st := stateOf(c); st != nil {
		return st.lockKey
	}
	return ""
}

// RedisKey returns the Redis key of the request's lock: Key(c) with the
// namespace of the Guard that took it ("ns:sku:42"), or "" outside a
// guarded route. It is the key the Guard's log lines name and the one to
// give "seckillguard inspect" (without -namespace).
func RedisKey(c *gin.Context) string {
	if st := stateOf(c); st != nil && st.lockKey != "" {
		return st.locks.Key(st.lockKey)
	}
	return ""
}

// Token returns the fencing token of the innermost lock the request holds.
func Token(c *gin.Context) (fencing.Token, bool) {
	if c.Request == nil {
		return 0, false
	}
	return fencing.FromContext(c.Request.Context())
}

// AbortStale answers 409 for a handler whose write was refused as stale
// (errors.Is(err, fencing.ErrStale)): {"error":"stale_write"}, or
// {"error":"lock_lost"} when err says that the lock was lost (lock.ErrLost,
// or the request's context was cancelled by the loss). It records err with
// c.Error, and the answer is never stored by Idempotent, so a retry runs
// again. On a Combining route the whole batch fails, as every stale write
// makes it fail: each of its requests is answered 409. It is the way for a
// handler to report that its work did not happen under its lock; a handler
// that writes an answer of its own instead sends that answer as written.
func AbortStale(c *gin.Context, err error) {
	_ = c.Error(err)
	if st := stateOf(c); st != nil {
		st.unrepeatable = true
	}
	a := answerStaleWrite
	if !errors.Is(err, fencing.ErrStale) && (errors.Is(err, lock.ErrLost) || c.Request != nil && Lost(c.Request.Context())) {
		a = answerLockLost
	}
	abort(c, a, 0)
}

// Lost reports whether a lock the request held was lost while the handler
// ran (its context was cancelled with cause lock.ErrLost).
func Lost(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), lock.ErrLost)
}
