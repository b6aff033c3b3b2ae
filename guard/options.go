package guard

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
)

// An Option configures a Guard.
type Option func(*options)

type options struct {
	log      *slog.Logger
	lockOpts []lock.Option
	defaults []RouteOption
}

// WithLogger sets where the Guard logs lost locks, long holds, unstored
// responses and Redis trouble. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithLockOptions passes options to the Guard's lock Client, such as
// lock.WithWatchdogTimeout (default 30s) and lock.WithNamespace (default:
// none; the resolved key is the Redis key).
func WithLockOptions(opts ...lock.Option) Option {
	return func(o *options) { o.lockOpts = append(o.lockOpts, opts...) }
}

// WithDefaults sets route options that apply to every route of this Guard
// before the route's own options. Default: none (each option's own default).
func WithDefaults(opts ...RouteOption) Option {
	return func(o *options) { o.defaults = append(o.defaults, opts...) }
}

// Defaults of the route options.
const (
	DefaultWait       = 2 * time.Second // how long Lock waits for a busy key before answering busy
	DefaultRetryAfter = time.Second     // Retry-After of busy and in-progress answers
	DefaultLongHold   = time.Second     // holds longer than this are logged
	DefaultRecordTTL  = 24 * time.Hour  // how long an idempotent response is replayed
)

// A RouteOption configures the middleware of one route. Options are checked
// when the route is registered; a nonsensical value panics there, so the
// mistake stops the service at boot rather than under traffic.
type RouteOption func(*route)

// route is the resolved configuration of one guarded route.
type route struct {
	wait       time.Duration
	lease      time.Duration // 0: the watchdog renews the lock
	busyStatus int
	busyCode   string
	retryAfter time.Duration
	failOpen   bool
	bodyLimit  int64
	longHold   time.Duration
	idem       idemConfig
}

func defaultRoute() route {
	return route{
		wait:       DefaultWait,
		busyStatus: http.StatusTooManyRequests,
		busyCode:   "busy",
		retryAfter: DefaultRetryAfter,
		bodyLimit:  ginmw.DefaultBodyLimit,
		longHold:   DefaultLongHold,
		idem: idemConfig{
			header:      "Idempotency-Key",
			required:    true,
			ttl:         DefaultRecordTTL,
			maxResponse: ginmw.DefaultRecordLimit,
			fingerprint: FingerprintAuto,
		},
	}
}

func (g *Guard) route(opts []RouteOption) route {
	r := defaultRoute()
	for _, f := range g.defaults {
		if f != nil {
			f(&r)
		}
	}
	for _, f := range opts {
		if f != nil {
			f(&r)
		}
	}
	return r
}

func mustf(ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("guard: "+format, args...))
	}
}

// Wait sets how long Lock waits for a key another request holds before
// answering busy. Default DefaultWait (2s). Zero makes one attempt.
func Wait(d time.Duration) RouteOption {
	mustf(d >= 0, "Wait(%v): the wait must not be negative", d)
	return func(r *route) { r.wait = d }
}

// Lease holds the lock for at most d and turns the watchdog off for it: if
// the handler runs longer, the lock is lost (its context says so) and the
// fenced writes of the handler are refused. Default: no fixed lease; the
// watchdog renews the lock while the handler runs.
func Lease(d time.Duration) RouteOption {
	mustf(d >= time.Millisecond, "Lease(%v): the lease must be at least 1ms", d)
	return func(r *route) { r.lease = d }
}

// Busy sets the answer to a request whose key stays locked for the whole
// wait: status (default 429) and the "error" code of its JSON body (default
// "busy").
func Busy(status int, code string) RouteOption {
	mustf(status >= 400 && status <= 599, "Busy(%d, %q): the status must be 4xx or 5xx", status, code)
	mustf(code != "", "Busy(%d, %q): the error code must not be empty", status, code)
	return func(r *route) { r.busyStatus, r.busyCode = status, code }
}

// RetryAfter sets the Retry-After of busy and in-progress answers, in whole
// seconds rounded up. Default DefaultRetryAfter (1s).
func RetryAfter(d time.Duration) RouteOption {
	mustf(d > 0, "RetryAfter(%v): must be positive", d)
	return func(r *route) { r.retryAfter = d }
}

// FailOpen lets requests through without the lock (or without idempotency)
// when Redis cannot be reached, instead of answering 503. Default: fail
// closed. Only for routes where a duplicate costs less than an outage.
func FailOpen() RouteOption {
	return func(r *route) { r.failOpen = true }
}

// BodyLimit sets how much of a request body the middleware reads to find
// key fields and fingerprints; a longer body is answered 413. Default
// ginmw.DefaultBodyLimit (1 MiB).
func BodyLimit(n int64) RouteOption {
	mustf(n > 0, "BodyLimit(%d): must be positive", n)
	return func(r *route) { r.bodyLimit = n }
}

// LongHold sets the hold time above which a hold is logged as a warning:
// the critical section should hold no remote call. Default
// DefaultLongHold (1s).
func LongHold(d time.Duration) RouteOption {
	mustf(d > 0, "LongHold(%v): must be positive", d)
	return func(r *route) { r.longHold = d }
}
