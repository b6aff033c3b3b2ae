package guard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/lockmetrics"
)

// An Option configures a Guard.
type Option func(*options)

type options struct {
	log         *slog.Logger
	render      ginmw.Renderer
	lockOpts    []lock.Option
	defaults    []RouteOption
	hook        StepHook
	namespace   string
	nsSet       bool
	lockMetrics *lockmetrics.Metrics
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

// WithRenderer sets how the Guard writes the answers it gives by itself
// (busy, missing key field, Redis unavailable, idempotency key reused...):
// ginmw.ProblemJSON for RFC 9457 application/problem+json, or a Renderer of
// your own. Default ginmw.JSONRenderer: {"error": code, ...}.
func WithRenderer(r ginmw.Renderer) Option {
	return func(o *options) { o.render = r }
}

// WithLockOptions passes options to the Guard's lock Client, such as
// lock.WithWatchdogTimeout (default 30s). A lock.WithNamespace given here
// is the Guard's namespace, as if given to WithNamespace: it prefixes the
// idempotency records too. An option the lock Client refuses (a namespace
// with a brace, a watchdog timeout under 30ms) makes New panic with the
// Client's error, rather than every request answer 500.
func WithLockOptions(opts ...lock.Option) Option {
	return func(o *options) { o.lockOpts = append(o.lockOpts, opts...) }
}

// WithNamespace puts ns and a colon in front of every key the Guard writes,
// so that two services (or staging and production) on one Redis never see
// each other's keys: its locks ("ns:sku:42", and what Redisson's rule
// derives from that name, "redisson_lock_token:{ns:sku:42}"), its
// idempotency records and in-progress markers, and the semaphores of
// WaitForFirst. It configures the Guard's lock Client too
// (lock.WithNamespace), and is applied there alone, once per key. Key(c)
// still returns the name without it; RedisKey(c), the log lines and the
// inspector show the full key. ns may not contain "{" or "}"; New panics
// on one (given here or in a lock.WithNamespace), and when WithLockOptions
// also carries a lock.WithNamespace that differs. Default: none, the namespace of a lock.WithNamespace in
// WithLockOptions if there is one.
func WithNamespace(ns string) Option {
	return func(o *options) { o.namespace, o.nsSet = ns, true }
}

// WithLockMetrics makes the Guard's lock Client report its events to m
// instead of to lock metrics of the Guard's own; the Guard's Collector then
// leaves the lock series (package lockmetrics) to m, which its creator
// registers. It is how a Guard and lock Clients of your own share one
// registry: give them all m. Default: the Guard measures its lock Client
// with lock metrics of its own, in its Collector; do not also give that
// Client a lockmetrics observer with WithLockOptions, as both would describe
// the same series and the registry refuses the second.
func WithLockMetrics(m *lockmetrics.Metrics) Option {
	return func(o *options) { o.lockMetrics = m }
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
	// DefaultInProgressLease is how long an idempotency key stays in
	// progress without a renewal when neither InProgressLease nor
	// lock.WithWatchdogTimeout (see WithLockOptions) says otherwise: the
	// default lease is the Guard's lock watchdog timeout, whose own default
	// is lock.DefaultWatchdogTimeout.
	DefaultInProgressLease = lock.DefaultWatchdogTimeout
	// DefaultBodyTimeout bounds how long Lock waits for a request's body
	// before it takes the lock.
	DefaultBodyTimeout = 5 * time.Second
)

// A RouteOption configures the middleware of one route. Making an option
// never panics: an option with a nonsensical value carries an error matching
// ErrBadOption, and the middleware it is given to refuses it where the route
// is registered (Lock, Idempotent and Policies panic with the error, New
// with an invalid WithDefaults option; LoadPolicies returns it with the
// line), so the mistake stops the service at boot rather than under traffic.
//
// Most options configure only one of the two middlewares, and given to the
// other one they would do nothing, so they are refused there too (and by
// Policies.With on a route without that middleware):
//
//   - Lock: Wait, Lease, Busy, BodyTimeout, LongHold, Combining, MaxBatch, MaxBatchTime.
//   - Idempotent: IdempotencyHeader, IdempotencyKey, OptionalKey, Scope, Unscoped, UseFingerprint, RecordTTL, InProgressLease, WaitForFirst, StoreClientErrors, StoreServerErrors, MaxResponse, ReplayHeaders.
//   - both: RetryAfter, FailOpen, BodyLimit.
//
// WithDefaults and policy files may set options of either kind for every
// route.
type RouteOption func(*route)

// ErrBadOption is matched by the error of every refused route option.
var ErrBadOption = errors.New("guard: invalid route option")

// MaxBodyLimit is the largest BodyLimit: the middleware holds a body it
// reads in memory whole, so the limit bounds what one request can make the
// process allocate. 1 GiB.
const MaxBodyLimit = ginmw.MaxBodyLimit

// optionUse says which middleware reads an option.
type optionUse uint8

const (
	useBoth optionUse = iota // both, or: applying defaults, which may set either kind
	useLock
	useIdem
)

func (u optionUse) String() string {
	switch u {
	case useLock:
		return "Lock"
	case useIdem:
		return "Idempotent"
	}
	return "Lock and Idempotent"
}

// route is the resolved configuration of one guarded route.
type route struct {
	wait        time.Duration
	lease       time.Duration // 0: the watchdog renews the lock
	busyStatus  int
	busyCode    string
	retryAfter  time.Duration
	failOpen    bool
	bodyLimit   int64
	bodyTimeout time.Duration
	longHold    time.Duration
	idem        idemConfig

	// Combining: the Session of the batches (nil: no combining), its
	// bounds, and whether a bound was set (refused without a Session).
	session      Session
	maxBatch     int
	maxBatchTime time.Duration
	batchOpts    bool

	// building is the middleware whose own options are being applied
	// (useBoth while defaults are); errs collects refused options.
	building optionUse
	errs     []error
}

func defaultRoute() route {
	return route{
		wait:         DefaultWait,
		busyStatus:   http.StatusTooManyRequests,
		busyCode:     "busy",
		retryAfter:   DefaultRetryAfter,
		bodyLimit:    ginmw.DefaultBodyLimit,
		bodyTimeout:  DefaultBodyTimeout,
		longHold:     DefaultLongHold,
		maxBatch:     DefaultMaxBatch,
		maxBatchTime: DefaultMaxBatchTime,
		idem: idemConfig{
			header:      "Idempotency-Key",
			required:    true,
			ttl:         DefaultRecordTTL,
			lease:       DefaultInProgressLease,
			maxResponse: ginmw.DefaultRecordLimit,
			fingerprint: FingerprintAuto,
		},
	}
}

// route resolves the configuration of a route of the middleware use: the
// Guard's defaults, then opts. The error joins every refused option.
func (g *Guard) route(opts []RouteOption, use optionUse) (route, error) {
	r := defaultRoute()
	// A key in progress frees itself when its instance dies, as the
	// instance's locks do.
	r.idem.lease = g.locks.WatchdogTimeout()
	applyOptions(&r, useBoth, g.defaults)
	applyOptions(&r, use, opts)
	if r.batchOpts && r.session == nil && use != useIdem {
		r.errs = append(r.errs, fmt.Errorf("%w: MaxBatch and MaxBatchTime bound the batches of Combining and do nothing without it", ErrBadOption))
	}
	return r, errors.Join(r.errs...)
}

// mustRoute is route for the middleware constructors, which panic with the
// error at registration.
func (g *Guard) mustRoute(opts []RouteOption, use optionUse) route {
	r, err := g.route(opts, use)
	if err != nil {
		panic(err)
	}
	return r
}

func applyOptions(r *route, use optionUse, opts []RouteOption) {
	r.building = use
	for _, f := range opts {
		if f != nil {
			f(r)
		}
	}
	r.building = useBoth
}

// checkOption returns the error of option o alone, or nil.
func checkOption(o RouteOption) error {
	r := defaultRoute()
	applyOptions(&r, useBoth, []RouteOption{o})
	return errors.Join(r.errs...)
}

func mustf(ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf("guard: "+format, args...))
	}
}

// invalid is an option that carries the error of a nonsensical value.
func invalid(format string, args ...any) RouteOption {
	err := fmt.Errorf("%w: "+format, append([]any{ErrBadOption}, args...)...)
	return func(r *route) { r.errs = append(r.errs, err) }
}

// option is the option named name that only the middleware use reads; set
// applies it.
func option(use optionUse, name string, set func(*route)) RouteOption {
	return func(r *route) {
		if r.building != useBoth && r.building != use {
			r.errs = append(r.errs, fmt.Errorf("%w: %s configures %s and does nothing given to %s", ErrBadOption, name, use, r.building))
			return
		}
		set(r)
	}
}

// Wait sets how long Lock waits for a key another request holds before
// answering busy. Default DefaultWait (2s). Zero makes one attempt.
func Wait(d time.Duration) RouteOption {
	if d < 0 {
		return invalid("Wait(%v): the wait must not be negative", d)
	}
	return option(useLock, "Wait", func(r *route) { r.wait = d })
}

// Lease holds the lock for at most d and turns the watchdog off for it: if
// the handler runs longer, the lock is lost (its context says so) and the
// fenced writes of the handler are refused. Default: no fixed lease; the
// watchdog renews the lock while the handler runs.
func Lease(d time.Duration) RouteOption {
	if d < time.Millisecond {
		return invalid("Lease(%v): the lease must be at least 1ms", d)
	}
	return option(useLock, "Lease", func(r *route) { r.lease = d })
}

// Busy sets the answer to a request whose key stays locked for the whole
// wait: status (default 429) and the "error" code of its JSON body (default
// "busy").
func Busy(status int, code string) RouteOption {
	if err := checkBusy(status, code); err != nil {
		return invalid("Busy(%d, %q): %v", status, code, err)
	}
	return option(useLock, "Busy", func(r *route) { r.busyStatus, r.busyCode = status, code })
}

func checkBusy(status int, code string) error {
	switch {
	case status < 400 || status > 599:
		return errors.New("the status must be 4xx or 5xx")
	case code == "":
		return errors.New("the error code must not be empty")
	}
	return nil
}

// RetryAfter sets the Retry-After of busy and in-progress answers, in whole
// seconds rounded up. Default DefaultRetryAfter (1s).
func RetryAfter(d time.Duration) RouteOption {
	if d <= 0 {
		return invalid("RetryAfter(%v): must be positive", d)
	}
	return func(r *route) { r.retryAfter = d }
}

// FailOpen lets requests through without the lock (or without idempotency)
// when Redis cannot be reached (lock.ErrUnavailable), instead of answering
// 503. A lock Client that fails for another reason (closed) still answers
// 503. Default: fail closed. Only for routes where a duplicate costs less
// than an outage.
func FailOpen() RouteOption {
	return func(r *route) { r.failOpen = true }
}

// BodyLimit sets how much of a request body the middleware reads to find
// key fields and fingerprints; a longer body is answered 413. Default
// ginmw.DefaultBodyLimit (1 MiB); at most MaxBodyLimit (1 GiB).
func BodyLimit(n int64) RouteOption {
	if n <= 0 || n > MaxBodyLimit {
		return invalid("BodyLimit(%d): want 1 to MaxBodyLimit (%d) bytes", n, int64(MaxBodyLimit))
	}
	return func(r *route) { r.bodyLimit = n }
}

// BodyTimeout bounds how long Lock waits for the request body, which it
// reads whole (up to BodyLimit) before it takes the lock, so that a client
// sending its body slowly delays only its own request and never holds the
// lock while the handler waits for bytes. A body not complete within d is
// answered 408 {"error":"body_timeout"}. The bound is a read deadline on the
// connection (http.ResponseController); where the ResponseWriter offers
// none, the server's ReadTimeout is the only bound. Default
// DefaultBodyTimeout (5s).
func BodyTimeout(d time.Duration) RouteOption {
	if d <= 0 {
		return invalid("BodyTimeout(%v): must be positive", d)
	}
	return option(useLock, "BodyTimeout", func(r *route) { r.bodyTimeout = d })
}

// LongHold sets the hold time above which a hold is logged as a warning:
// the critical section should hold no remote call. Default
// DefaultLongHold (1s).
func LongHold(d time.Duration) RouteOption {
	if d <= 0 {
		return invalid("LongHold(%v): must be positive", d)
	}
	return option(useLock, "LongHold", func(r *route) { r.longHold = d })
}
