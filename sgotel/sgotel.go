// Package sgotel traces seckillguard with OpenTelemetry. It is a module of
// its own, so that the library's go.mod carries no OpenTelemetry
// requirement: only a service that imports sgotel gets one.
//
// NewLockTracer turns the events of a lock Client (lock.WithObserver) into
// two spans per hold: "lock.wait", from the call to its acquisition, and
// "lock.hold", from the acquisition to the release or the loss. StepHook
// gives a Guard's steps (guard.WithStepHook) spans of their own:
// "guard.lock", "guard.idempotency.begin", "guard.idempotency.replay",
// "guard.idempotency.finish" and "guard.handler", the handler's own spans
// nested in the last. GuardOptions sets up both for a Guard:
//
//	g := guard.New(rdb, sgotel.GuardOptions()...)
//
// Span names are bounded: a lock's name, derived from requests, is never
// one, and is recorded as an attribute only with WithLockName.
package sgotel

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
)

// ScopeName is the instrumentation scope of the tracer sgotel uses.
const ScopeName = "github.com/seckillguard/seckillguard/sgotel"

// The attributes sgotel sets.
const (
	// AttrOutcome is how a hold or a step ended: for "lock.wait"
	// "acquired"; for "lock.hold" "released", "released_later" or "lost";
	// for the Guard's steps the guard.Outcome* word.
	AttrOutcome = attribute.Key("seckillguard.outcome")
	// AttrLockKind is the kind of lock (lock.Kinds()): "mutex", "rwmutex",
	// "semaphore", as the inspector names it.
	AttrLockKind = attribute.Key("seckillguard.lock.kind")
	// AttrLockMode is the side of an RWMutex hold: "read" or "write"; not
	// set for the other kinds.
	AttrLockMode = attribute.Key("seckillguard.lock.mode")
	// AttrLockName is the lock's full Redis name (lock.Event.Name, the
	// namespace included), or the key a Guard's step locks: set only with
	// WithLockName.
	AttrLockName = attribute.Key("seckillguard.lock.name")
	// AttrToken is the hold's fencing token, where it has one.
	AttrToken = attribute.Key("seckillguard.lock.token")
	// AttrWait is how long an acquisition took, waiting included, in
	// seconds.
	AttrWait = attribute.Key("seckillguard.lock.wait_seconds")
	// AttrHeld is how long a hold lasted, in seconds.
	AttrHeld = attribute.Key("seckillguard.lock.held_seconds")
	// AttrRenewals is how many times the watchdog renewed a hold.
	AttrRenewals = attribute.Key("seckillguard.lock.renewals")
	// AttrRoute is the route template of a Guard's step, as OpenTelemetry's
	// HTTP conventions name it.
	AttrRoute = attribute.Key("http.route")
	// AttrMethod is the request's method.
	AttrMethod = attribute.Key("http.request.method")
	// AttrStatus is the status of the answer a handler or a replay gave.
	AttrStatus = attribute.Key("http.response.status_code")
)

// An Option configures the tracing.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	lockName bool
}

// WithTracerProvider sets where spans go. Default: the global provider
// (otel.GetTracerProvider()), looked up when NewLockTracer or StepHook is
// called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithLockName records the lock's name (AttrLockName) on "lock.wait",
// "lock.hold" and "guard.lock" spans. Default: off, because names derived
// from requests ("sku:42", "order:<user>") can be unbounded and can carry
// what a trace backend should not store; the route template (AttrRoute) is
// on every Guard span either way.
func WithLockName() Option {
	return func(c *config) { c.lockName = true }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	return c
}

func (c config) tracer() trace.Tracer { return c.tp.Tracer(ScopeName) }

// A LockTracer makes spans of the events of a lock Client's holds: a
// "lock.wait" span for each first acquisition, from the call to the
// acquisition, and a "lock.hold" span from the acquisition to the hold's
// end, both children of the span in the context the hold was taken with.
// A loss ends the hold's span with status Error and the cause recorded; a
// handover (to a waiter of the same Client) is an event on it. Package lock
// reports acquisitions that succeeded: a wait that ends without the lock
// (busy, a context that ended) makes no "lock.wait" span, and shows on the
// caller's own span ("guard.lock" for a Guard).
type LockTracer struct {
	cfg    config
	tracer trace.Tracer

	mu    sync.Mutex
	holds map[string]*heldSpan // by the hold's owner field
}

type heldSpan struct {
	span     trace.Span
	renewals int
}

// NewLockTracer returns a LockTracer; pass its Observe to lock.WithObserver.
func NewLockTracer(opts ...Option) *LockTracer {
	cfg := newConfig(opts)
	return &LockTracer{cfg: cfg, tracer: cfg.tracer(), holds: make(map[string]*heldSpan)}
}

// Observe makes spans of e; it is a lock.Observer.
func (t *LockTracer) Observe(e lock.Event) {
	switch e.Type {
	case lock.EventAcquired:
		t.acquired(e)
	case lock.EventRenewed, lock.EventHandedOver:
		t.mu.Lock()
		h := t.holds[e.Owner]
		if h != nil && e.Type == lock.EventRenewed {
			h.renewals++
		}
		t.mu.Unlock()
		if h != nil && e.Type == lock.EventHandedOver {
			h.span.AddEvent("handed_over")
		}
	case lock.EventReleased, lock.EventReleasedLater, lock.EventLost:
		t.mu.Lock()
		h := t.holds[e.Owner]
		delete(t.holds, e.Owner)
		t.mu.Unlock()
		if h == nil {
			return // a hold whose acquisition was not reported (a MultiLock's, a RedLock's)
		}
		outcome := e.Type.String()
		h.span.SetAttributes(AttrOutcome.String(outcome), AttrHeld.Float64(e.Held.Seconds()), AttrRenewals.Int(h.renewals))
		if e.Type == lock.EventLost {
			if e.Cause != nil {
				h.span.RecordError(e.Cause)
			}
			h.span.SetStatus(codes.Error, outcome)
		}
		h.span.End()
	}
}

func (t *LockTracer) acquired(e lock.Event) {
	now := time.Now()
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, AttrLockKind.String(string(e.Kind)))
	if e.Mode != "" {
		attrs = append(attrs, AttrLockMode.String(e.Mode))
	}
	if t.cfg.lockName {
		attrs = append(attrs, AttrLockName.String(e.Name))
	}
	if e.Token > 0 {
		attrs = append(attrs, AttrToken.Int64(int64(e.Token)))
	}
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	_, wait := t.tracer.Start(ctx, "lock.wait", trace.WithTimestamp(now.Add(-e.Wait)), trace.WithAttributes(attrs...))
	wait.SetAttributes(AttrOutcome.String("acquired"), AttrWait.Float64(e.Wait.Seconds()))
	wait.End(trace.WithTimestamp(now))
	_, hold := t.tracer.Start(ctx, "lock.hold", trace.WithTimestamp(now), trace.WithAttributes(attrs...))
	t.mu.Lock()
	if old := t.holds[e.Owner]; old != nil {
		old.span.End() // unreachable: every hold has an owner field of its own
	}
	t.holds[e.Owner] = &heldSpan{span: hold}
	t.mu.Unlock()
}

// stepNames are the span names of the Guard's steps.
var stepNames = map[guard.Step]string{
	guard.StepLock:              "guard.lock",
	guard.StepIdempotencyBegin:  "guard.idempotency.begin",
	guard.StepIdempotencyReplay: "guard.idempotency.replay",
	guard.StepIdempotencyFinish: "guard.idempotency.finish",
	guard.StepHandler:           "guard.handler",
}

// failed are the outcomes that give a step's span status Error.
var failed = map[string]bool{
	guard.OutcomeBusy: true, guard.OutcomeCancelled: true, guard.OutcomeUnavailable: true,
	guard.OutcomeFailOpen: true, guard.OutcomeInvalid: true, guard.OutcomeInProgress: true,
	guard.OutcomeMismatch: true, guard.OutcomeNotStored: true, guard.OutcomeStale: true,
	guard.OutcomeLost: true, guard.OutcomePanic: true,
}

// StepHook returns a guard.StepHook that gives each step of a guarded
// request a span, a child of the span in the request's context (the
// server span of an HTTP instrumentation): "guard.lock" (the wait for the
// route's lock), "guard.idempotency.begin", "guard.idempotency.replay",
// "guard.idempotency.finish" and "guard.handler", in which the handler's own
// spans nest. Each has AttrRoute, AttrMethod and AttrOutcome, "guard.lock"
// AttrWait and AttrToken, the handler and replay AttrStatus. A busy lock, a
// lost one, a stale write, Redis unavailable (fail-open included), a client
// that went away, a key in progress or reused, an answer not stored, a
// panic and a 5xx answer give status Error.
func StepHook(opts ...Option) guard.StepHook {
	cfg := newConfig(opts)
	tracer := cfg.tracer()
	return func(ctx context.Context, s guard.StepInfo) (context.Context, func(guard.StepResult)) {
		name, ok := stepNames[s.Step]
		if !ok {
			name = "guard.step"
		}
		attrs := []attribute.KeyValue{AttrRoute.String(s.Route), AttrMethod.String(s.Method)}
		if cfg.lockName && s.Key != "" {
			attrs = append(attrs, AttrLockName.String(s.Key))
		}
		ctx, span := tracer.Start(ctx, name, trace.WithAttributes(attrs...))
		return ctx, func(r guard.StepResult) {
			span.SetAttributes(AttrOutcome.String(r.Outcome))
			if s.Step == guard.StepLock || r.Wait > 0 {
				span.SetAttributes(AttrWait.Float64(r.Wait.Seconds()))
			}
			if r.Token > 0 {
				span.SetAttributes(AttrToken.Int64(int64(r.Token)))
			}
			if r.Status > 0 {
				span.SetAttributes(AttrStatus.Int(r.Status))
			}
			switch {
			case failed[r.Outcome]:
				if r.Err != nil {
					span.RecordError(r.Err)
				}
				span.SetStatus(codes.Error, r.Outcome)
			case r.Status >= 500:
				span.SetStatus(codes.Error, "status "+strconv.Itoa(r.Status))
			}
			span.End()
		}
	}
}

// GuardOptions returns the options that trace a Guard: its steps
// (StepHook) and the holds of its lock Client (a LockTracer, beside the
// Guard's own metrics).
func GuardOptions(opts ...Option) []guard.Option {
	return []guard.Option{
		guard.WithStepHook(StepHook(opts...)),
		guard.WithLockOptions(lock.WithObserver(NewLockTracer(opts...).Observe)),
	}
}
