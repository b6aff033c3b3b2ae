package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
)

// Mode is how an instance keeps two purchases of one SKU apart.
type Mode string

// The modes of the demo, from the oversold sale to its cure.
const (
	// ModeNone takes no lock at all.
	ModeNone Mode = "none"
	// ModeLocal takes a sync.Mutex of the instance: one buyer at a time per
	// instance, and as many at a time as there are instances: the incident
	// of three instances each with its own lock, overselling.
	ModeLocal Mode = "local"
	// ModeGuard takes the distributed lock of the policy file, renewed by
	// its watchdog, and fences the writes with its token.
	ModeGuard Mode = "guard"
	// ModeGuardLease is ModeGuard with a fixed lease (Config.Lease) and no
	// watchdog: a pause longer than the lease loses the lock, and the
	// backstop must refuse the late writes.
	ModeGuardLease Mode = "guard-lease"
	// ModeGuardCombine is ModeGuard with the purchases of one instance
	// combined (guard.Combining): those that queue behind the holder of a
	// SKU's lock run in the holder's batch, one transaction and one commit
	// per hold (see combine.go).
	ModeGuardCombine Mode = "guard-combine"
)

var allModes = []Mode{ModeNone, ModeLocal, ModeGuard, ModeGuardLease, ModeGuardCombine}

func parseMode(s string) (Mode, error) {
	for _, m := range allModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q: want none, local, guard, guard-lease or guard-combine", s)
}

// guarded reports whether m uses seckillguard.
func (m Mode) guarded() bool { return m == ModeGuard || m == ModeGuardLease || m == ModeGuardCombine }

// Config configures one instance of the service.
type Config struct {
	Mode     Mode
	Policies *guard.Policies // the guard modes' per-route policies (guard.yaml)
	Watchdog time.Duration   // the lock watchdog timeout, and with it the in-progress lease of idempotency keys; 0 means lock.DefaultWatchdogTimeout (30s)
	Lease    time.Duration   // ModeGuardLease: the fixed lease of every lock a route takes, unless its policy sets one

	// HoldDelay is a pause inside the critical section, after the stock is
	// read and before it is written: a stand-in for a GC pause or a slow
	// call. HoldRate is the fraction of purchases that pause (0 or 1: all).
	HoldDelay time.Duration
	HoldRate  float64

	Logger *slog.Logger // default slog.Default()
}

// The routes of the service.
const (
	routeBuy      = "/api/seckill/:sku"
	routeProduct  = "/api/products/:sku"
	routeProducts = "/api/admin/products"
	routeHealth   = "/healthz"
	routeMetrics  = "/metrics"
)

// userKey is the gin context key of the buyer's id; the policy file scopes
// idempotency keys with "<ctx:user_id>".
const userKey = "user_id"

// Service is one instance of the flash-sale service: a gin engine on its own
// Redis client and database pool.
type Service struct {
	cfg     Config
	db      *gorm.DB
	rdb     redis.UniversalClient
	guard   *guard.Guard // nil in ModeNone and ModeLocal
	local   sync.Mutex   // ModeLocal: the in-process lock of the incident
	soldOut soldOutMemory
	log     *slog.Logger

	reg    *prometheus.Registry
	orders prometheus.Counter
	fast   prometheus.Counter
	stale  *prometheus.CounterVec

	engine *gin.Engine

	// afterRead, when set, runs in a purchase right after the stock was
	// read: tests act there as an older lock holder writing between the
	// purchase's read and its write.
	afterRead atomic.Pointer[func()]
}

// NewService builds an instance on rdb and db (db with gormplugin
// installed). The schema must exist (migrate).
func NewService(cfg Config, rdb redis.UniversalClient, db *gorm.DB) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HoldDelay < 0 || cfg.HoldRate < 0 || cfg.HoldRate > 1 {
		return nil, fmt.Errorf("hold delay %v at rate %v: want a delay >= 0 and a rate in [0, 1]", cfg.HoldDelay, cfg.HoldRate)
	}
	s := &Service{
		cfg:     cfg,
		db:      db,
		rdb:     rdb,
		soldOut: soldOutMemory{until: make(map[string]time.Time)},
		log:     cfg.Logger,
		reg:     prometheus.NewRegistry(),
		orders: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_orders_total", Help: "Orders created.",
		}),
		fast: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_sold_out_fast_total", Help: "Purchases answered sold_out without the lock, from the memory of a sold-out SKU.",
		}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seckill_stale_writes_refused_total",
			Help: "Purchase writes refused by the backstop, by what refused them: lock_lost (the lock's context was cancelled; the write was never sent) or fence (the database found a newer token on the row).",
		}, []string{"by"}),
	}
	s.reg.MustRegister(s.orders, s.fast, s.stale)
	// The runtime's and the process's own series (go_*, process_*), as a
	// service exports them beside its domain metrics.
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, by := range []string{refusedLockLost, refusedFence} {
		s.stale.WithLabelValues(by)
	}

	if cfg.Mode.guarded() {
		if cfg.Policies == nil {
			return nil, errors.New("mode " + string(cfg.Mode) + " needs policies")
		}
		if !covers(cfg.Policies, http.MethodPost, routeBuy) {
			return nil, fmt.Errorf("the policies have no entry for POST %s: purchases would run without a lock", routeBuy)
		}
		opts := []guard.Option{guard.WithLogger(cfg.Logger)}
		if cfg.Watchdog > 0 {
			// The in-progress lease of idempotency keys follows it: a key
			// whose instance died frees itself as soon as that instance's
			// locks do (a policy's in_progress_lease still wins).
			opts = append(opts, guard.WithLockOptions(lock.WithWatchdogTimeout(cfg.Watchdog)))
		}
		if cfg.Mode == ModeGuardLease {
			if cfg.Lease <= 0 {
				return nil, errors.New("mode guard-lease needs a lease")
			}
			opts = append(opts, guard.WithDefaults(guard.Lease(cfg.Lease)))
		}
		s.guard = guard.New(rdb, opts...)
		s.reg.MustRegister(s.guard.Collector())
	}

	pol := cfg.Policies
	if cfg.Mode == ModeGuardCombine {
		var err error
		if pol, err = combining(pol, db); err != nil {
			s.guard.Close()
			return nil, err
		}
	}
	r := gin.New()
	r.Use(gin.Recovery(), s.identify, s.admit)
	if s.guard != nil {
		// Idempotency, then the lock, for every route the file names.
		r.Use(s.guard.Policies(pol))
	}
	r.GET(routeHealth, s.health)
	r.HEAD(routeHealth, s.health)
	r.GET(routeMetrics, gin.WrapH(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})))
	r.GET(routeProduct, s.product)
	if cfg.Mode == ModeLocal {
		r.POST(routeBuy, s.withLocalLock, s.buy)
		r.POST(routeProducts, s.withLocalLock, s.putProduct)
	} else {
		r.POST(routeBuy, s.buy)
		r.POST(routeProducts, s.putProduct)
	}
	if s.guard != nil {
		if un := cfg.Policies.Unmatched(r.Routes()); len(un) > 0 {
			s.guard.Close()
			return nil, fmt.Errorf("the policies name routes this service does not have: %v", un)
		}
	}
	s.engine = r
	return s, nil
}

// covers reports whether p has an entry for the route.
func covers(p *guard.Policies, method, path string) bool {
	for _, rp := range p.Routes() {
		if rp.Method == method && rp.Path == path {
			return true
		}
	}
	return false
}

// Handler returns the service's HTTP handler.
func (s *Service) Handler() http.Handler { return s.engine }

// Registry returns the service's own Prometheus registry, served on /metrics.
func (s *Service) Registry() *prometheus.Registry { return s.reg }

// Close stops the service's lock client. Close after the HTTP server has
// drained.
func (s *Service) Close() error {
	if s.guard != nil {
		return s.guard.Close()
	}
	return nil
}

// identify takes the buyer's id from the X-User-ID header. A real service
// takes it from a verified session; the header keeps the demo's buyers
// simple. The id is what idempotency keys are scoped by.
func (s *Service) identify(c *gin.Context) {
	v := c.GetHeader("X-User-ID")
	if v == "" {
		return
	}
	if !validID(v) {
		ginmw.Abort(c, http.StatusBadRequest, "bad_user_id", ginmw.Extra("detail", "X-User-ID: 1 to 64 letters, digits and . _ : -"))
		return
	}
	c.Set(userKey, v)
}

// withLocalLock holds the instance's sync.Mutex around the rest of the
// chain: correct in one process, useless across several (ModeLocal).
func (s *Service) withLocalLock(c *gin.Context) {
	s.local.Lock()
	defer s.local.Unlock()
	c.Next()
}

// health answers 200 when Redis and the database answer within
// healthTimeout, else 503 with a short reason ("redis unreachable"); the
// driver's error, which may name hosts and users, goes to the log only.
func (s *Service) health(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), healthTimeout)
	defer cancel()
	if err := ping(ctx, s.rdb, s.db); err != nil {
		reason := "unreachable"
		switch {
		case errors.Is(err, errRedisDown):
			reason = errRedisDown.Error()
		case errors.Is(err, errDatabaseDown):
			reason = errDatabaseDown.Error()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			reason += fmt.Sprintf(" (no answer within %v)", healthTimeout)
		}
		s.log.WarnContext(c.Request.Context(), "health check failed", "err", err)
		ginmw.Abort(c, http.StatusServiceUnavailable, "unhealthy", ginmw.Extra("detail", reason))
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ok", "mode": s.cfg.Mode})
}

// healthTimeout bounds a health check.
const healthTimeout = 2 * time.Second

// validID reports whether v is a usable user id or SKU: 1 to 64 ASCII
// letters, digits and . _ : -
func validID(v string) bool {
	if len(v) == 0 || len(v) > 64 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}
