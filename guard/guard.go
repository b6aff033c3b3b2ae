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
// (LoadPolicies, Guard.Policies). Every answer of the framework is JSON of
// the form {"error": "<code>", ...}.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
)

// A Guard holds what the middleware of one service shares: the Redis
// client, the lock Client (with its watchdog) and the metrics. Create one per
// process with New, install it with SetDefault for the package-level
// middleware, and Close it on shutdown.
type Guard struct {
	rdb      redis.UniversalClient
	locks    *lock.Client
	keeper   *keeper // renews the in-progress markers of idempotent requests
	log      *slog.Logger
	render   ginmw.Renderer // nil: ginmw's default
	defaults []RouteOption
	metrics  *metrics
	hook     StepHook // nil: none
}

// New returns a Guard on rdb (a single-node, Sentinel failover or Cluster
// client). It does no I/O. New panics when rdb is nil (a Guard without Redis
// is a mistake to find at boot) and with the error of an invalid
// WithDefaults option.
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
	m := newMetrics()
	// The Guard's lock events feed its Collector; a WithObserver among
	// o.lockOpts is told of them too.
	lockOpts := append([]lock.Option{lock.WithLogger(o.log), lock.WithObserver(m.locks.Observe)}, o.lockOpts...)
	r := defaultRoute()
	if applyOptions(&r, useBoth, o.defaults); len(r.errs) > 0 {
		panic(fmt.Errorf("guard: WithDefaults: %w", errors.Join(r.errs...)))
	}
	return &Guard{
		rdb:      rdb,
		locks:    lock.New(rdb, lockOpts...),
		keeper:   newKeeper(rdb, o.log),
		log:      o.log,
		render:   o.render,
		defaults: o.defaults,
		metrics:  m,
		hook:     o.hook,
	}
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
	lockKeyName      = "seckillguard.lock.key"
	idemKeyName      = "seckillguard.idempotency.record"
	idemFPName       = "seckillguard.idempotency.fingerprint"
	unrepeatableName = "seckillguard.lock.lost" // the lock was lost or a write was stale: do not replay the answer
	frameworkName    = "seckillguard.answered"  // the framework answered, not the handler: store nothing
)

// answeredByFramework marks the request as answered by the framework itself
// (busy, unavailable, the client gone, a key field refused, a body over the
// limit), not by the handler: an idempotency step around it stores nothing
// and releases the key at once, so that a retry runs.
func answeredByFramework(c *gin.Context) { c.Set(frameworkName, true) }

// Key returns the lock key the Lock middleware resolved for this request
// (e.g. "sku:42"), or "" outside a guarded route.
func Key(c *gin.Context) string { return c.GetString(lockKeyName) }

// Token returns the fencing token of the innermost lock the request holds.
func Token(c *gin.Context) (fencing.Token, bool) {
	if c.Request == nil {
		return 0, false
	}
	return fencing.FromContext(c.Request.Context())
}

// Lost reports whether a lock the request held was lost while the handler
// ran (its context was cancelled with cause lock.ErrLost).
func Lost(ctx context.Context) bool {
	return ctx.Err() != nil && isLost(context.Cause(ctx))
}
