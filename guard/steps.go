package guard

import (
	"context"
	"errors"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
)

// A Step is one thing the Guard does for a request, as a StepHook sees it.
type Step uint8

// The steps of a guarded request, in the order they happen. An Idempotent
// route runs StepIdempotencyBegin, then StepIdempotencyReplay (an answer
// was stored) or StepHandler and StepIdempotencyFinish (this request runs);
// a Lock route runs StepLock, then StepHandler once the lock is taken.
const (
	// StepLock: the Lock middleware waits for the route's lock and takes
	// it, or gives up (busy, Redis down, the client gone).
	StepLock Step = iota + 1
	// StepIdempotencyBegin: the Idempotent middleware looks up the
	// request's record and claims its key, waiting for a first request
	// still in progress up to WaitForFirst.
	StepIdempotencyBegin
	// StepIdempotencyReplay: it answers with the stored response.
	StepIdempotencyReplay
	// StepIdempotencyFinish: it stores the handler's answer, or drops its
	// claim so that a retry runs, once the request's answer is final: when
	// the request's last guard step ends (a Lock or Combining around the
	// Idempotent has judged the lock and committed the batch by then).
	StepIdempotencyFinish
	// StepHandler: the rest of the chain runs, holding the lock or the
	// key. A Combining route reports StepLock once per batch, for the
	// request that takes the lock, and StepHandler for every request's turn
	// in a batch (its outcome is the handler's; the batch's commit comes
	// after it). With two of the Guard's middlewares on one route, in either
	// order, the inner one's steps happen within the outer one's
	// StepHandler; Policies composes both in one middleware, with one
	// StepHandler around the handler.
	StepHandler
)

var stepNames = [...]string{
	StepLock: "lock", StepIdempotencyBegin: "idempotency_begin", StepIdempotencyReplay: "idempotency_replay",
	StepIdempotencyFinish: "idempotency_finish", StepHandler: "handler",
}

// String returns the step's name: "lock", "idempotency_begin",
// "idempotency_replay", "idempotency_finish", "handler".
func (s Step) String() string {
	if int(s) < len(stepNames) && stepNames[s] != "" {
		return stepNames[s]
	}
	return "unknown"
}

// StepInfo describes a step as it starts.
type StepInfo struct {
	Step   Step
	Method string // the request's method
	// Route is the request's route template (c.FullPath(), "unmatched" for
	// none): a bounded value, fit for span names and metric labels.
	Route string
	// Key is StepLock's resolved lock key ("sku:42"). It is derived from
	// the request, so unbounded: for logs, or a span attribute a service
	// chooses to record, never a span name or a metric label.
	Key string
}

// Outcomes of the steps (StepResult.Outcome), each a bounded word.
const (
	// StepLock
	OutcomeAcquired    = "acquired"    // the lock is held; the handler runs
	OutcomeBusy        = "busy"        // still held by another after the route's Wait
	OutcomeCancelled   = "cancelled"   // the client went away first (any step that waits)
	OutcomeUnavailable = "unavailable" // Redis unreachable: the request is refused
	OutcomeFailOpen    = "fail_open"   // Redis unreachable: the handler runs unguarded (FailOpen)
	OutcomeInvalid     = "invalid"     // the lock refused the key or the configuration

	// StepIdempotencyBegin
	OutcomeExecute    = "execute"     // the key is claimed; the handler runs
	OutcomeReplay     = "replay"      // an answer is stored: StepIdempotencyReplay follows
	OutcomeInProgress = "in_progress" // the first request with the key still runs (409)
	OutcomeMismatch   = "mismatch"    // the key was used with another request (422); also StepIdempotencyReplay's

	// StepIdempotencyReplay
	OutcomeReplayed = "replayed" // the stored answer was sent

	// StepIdempotencyFinish
	OutcomeStored    = "stored"     // the answer is replayed to retries
	OutcomeNotStored = "not_stored" // storing failed, or the answer was too large: a retry runs
	OutcomeDropped   = "dropped"    // the answer must not be replayed: a retry runs

	// StepHandler
	OutcomeOK    = "ok"    // the handler returned (whatever its status)
	OutcomeStale = "stale" // a fenced write was refused (fencing.ErrStale)
	OutcomeLost  = "lost"  // the lock was lost while it ran
	OutcomePanic = "panic" // it panicked
)

// A StepResult is how a step ended.
type StepResult struct {
	Outcome string        // one of the Outcome constants
	Wait    time.Duration // StepLock, StepIdempotencyBegin: how long taking the lock or the key took
	Token   fencing.Token // StepLock: the fencing token of the lock acquired
	Status  int           // StepHandler (0: it wrote nothing), StepIdempotencyReplay: the answer's status
	Err     error         // what went wrong, if anything
}

// A StepHook is told of each step of a guarded request as it starts, with
// the request's context at that point; it returns a context derived from
// ctx (or ctx itself) and a function the Guard calls once when the step
// ends. It is how tracing hooks in (package sgotel has an OpenTelemetry
// one); package guard depends on no tracing library.
//
// For StepHandler the returned context is the rest of the chain's request
// context, so that the handler's own spans nest in the step's; for the
// idempotency steps, that of the step's own Redis calls. For StepLock it is
// not used: the lock is taken with the request's context, so that the hold
// and the handler under it descend from the request, not from a step that
// has ended. The lock and the idempotency key are held with the request's
// context too.
//
// A hook runs on the request's goroutine and must be fast.
type StepHook func(ctx context.Context, s StepInfo) (context.Context, func(StepResult))

// WithStepHook sets the Guard's StepHook. Default: none.
func WithStepHook(h StepHook) Option {
	return func(o *options) { o.hook = h }
}

// A step is one guard middleware, written so that steps compose inside a
// single gin handler (a policy may run idempotency, then the lock, then the
// route). Every step begins the request's state (begin) and ends it.
type step func(c *gin.Context, next func())

// handler turns s into a gin middleware that answers through g's
// Renderer.
func (g *Guard) handler(s step) gin.HandlerFunc {
	return func(c *gin.Context) {
		g.metrics.touch(routeOf(c))
		if g.render != nil {
			ginmw.SetRenderer(c, g.render)
		}
		s(c, c.Next)
	}
}

// staleError returns the first error the handler reported with c.Error that
// matches fencing.ErrStale, or nil.
func staleError(c *gin.Context) error {
	for _, e := range c.Errors {
		if errors.Is(e.Err, fencing.ErrStale) {
			return e.Err
		}
	}
	return nil
}

// noStep ends a step no hook is told of.
func noStep(StepResult) {}

// step starts step s of c's request with ctx, through the Guard's hook:
// it returns the step's context and the function that ends it.
func (g *Guard) step(ctx context.Context, c *gin.Context, s Step, key string) (context.Context, func(StepResult)) {
	if g.hook == nil {
		return ctx, noStep
	}
	method, route := routeOf(c)
	sctx, end := g.hook(ctx, StepInfo{Step: s, Method: method, Route: route, Key: key})
	if sctx == nil {
		sctx = ctx
	}
	if end == nil {
		end = noStep
	}
	return sctx, end
}

// runHandler runs next, the rest of c's chain, as StepHandler: with the
// hook's context as its request context, and told how it ended (panics
// included, which go on).
func (g *Guard) runHandler(c *gin.Context, next func()) {
	if g.hook == nil {
		next()
		return
	}
	orig := c.Request
	ctx, end := g.step(orig.Context(), c, StepHandler, "")
	c.Request = orig.WithContext(ctx)
	done := false
	defer func() {
		c.Request = orig
		if !done {
			end(StepResult{Outcome: OutcomePanic})
		}
	}()
	next()
	done = true
	res := StepResult{Outcome: OutcomeOK}
	if c.Writer.Written() {
		res.Status = c.Writer.Status()
	}
	switch err := staleError(c); {
	case err != nil:
		res.Outcome, res.Err = OutcomeStale, err
	case Lost(ctx):
		res.Outcome, res.Err = OutcomeLost, context.Cause(ctx)
	}
	end(res)
}
