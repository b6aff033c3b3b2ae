package guard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
)

// The runtime of combining (Combining): the lines of waiting requests, the
// members of a batch and the batch its leader runs.

// testHookWaiting, set by tests, learns how many requests wait in a key's
// line each time one joins or leaves it.
var testHookWaiting atomic.Pointer[func(key string, n int)]

func noteWaiting(key string, n int) {
	if h := testHookWaiting.Load(); h != nil {
		(*h)(key, n)
	}
}

// combiner holds the lines of waiting requests of one Combining route, one
// line per key that has requests in this process.
type combiner struct {
	mu    sync.Mutex
	lines map[string]*line
}

// A line is the requests of one key in this process: whether a batch is
// taking requests (open), and the requests waiting for one, in arrival
// order.
type line struct {
	open    bool
	waiting []*member
}

// A member is one request on a combining route.
type member struct {
	g       *Guard
	c       *gin.Context
	st      *request // the request's guard state
	r       *route
	next    func()
	ctx     context.Context // the request's own context
	arrived time.Time
	// msgs carries the leader's messages: lead, run your turn, the
	// outcome. Buffered: the leader never waits for a member to read.
	msgs chan message
	// done carries the member's report of its turn to the leader.
	done chan turnReport

	// Set by the turn, read after it by the member's goroutine only.
	w        *heldWriter
	hooks    *[]func()     // OnCommit's
	orig     *http.Request // c.Request before the turn, set back when it ends
	panicked any
	hadPanic bool
}

type messageKind uint8

const (
	msgLead    messageKind = iota // lead the next batch
	msgRun                        // your turn: run the handler in the batch
	msgSkip                       // you were taken, but ended before your turn
	msgOutcome                    // the batch is over
)

type message struct {
	kind messageKind
	ctx  context.Context // msgRun: the batch's context
	err  error           // msgOutcome: nil when the batch committed
}

type turnReport struct {
	ok    bool // the handler answered a success and its part is kept
	stale bool // a write was refused as stale: the batch's lock is overtaken
}

// combineStep is lockStep for a Combining route.
func (g *Guard) combineStep(tmpl *ginmw.Template, r route) step {
	var lockOpts []lock.LockOption
	if r.lease > 0 {
		lockOpts = append(lockOpts, lock.WithLease(r.lease))
	}
	fits := &routeFits{tmpl: tmpl, log: g.log}
	cb := &combiner{lines: make(map[string]*line)}
	return func(c *gin.Context, next func()) {
		if !fits.applies(c, &r) {
			next()
			return
		}
		st := begin(c)
		returned := false
		defer func() { st.end(c, returned) }()
		g.combineRequest(c, st, cb, tmpl, &r, lockOpts, next)
		returned = true
	}
}

// combineRequest is the combining step of a request on a route its template
// applies to: it reads the body, resolves the key and joins the key's line,
// leading a batch or running in another's. The request's answer is written
// once its batch is over, before the step ends: an idempotency step around or
// inside it settles the record after the batch committed or failed.
func (g *Guard) combineRequest(c *gin.Context, st *request, cb *combiner, tmpl *ginmw.Template, r *route, lockOpts []lock.LockOption, next func()) {
	key, ok := g.prepareLock(c, tmpl, r)
	if !ok {
		return
	}
	g.metrics.touchBatch(routeOf(c))
	st.batched = true
	m := &member{
		g: g, c: c, st: st, r: r, next: next, ctx: c.Request.Context(), arrived: time.Now(),
		msgs: make(chan message, 2), done: make(chan turnReport, 1),
	}
	cb.mu.Lock()
	l := cb.lines[key]
	if l == nil {
		l = &line{}
		cb.lines[key] = l
	}
	lead := !l.open
	if lead {
		l.open = true
	} else {
		l.waiting = append(l.waiting, m)
		noteWaiting(key, len(l.waiting))
	}
	cb.mu.Unlock()
	if !lead && !g.follow(cb, l, key, m) {
		return
	}
	g.lead(cb, l, key, m, lockOpts)
}

// follow waits in line until m is handed the lead of a batch (true) or has
// had its turn in another's batch, or left the line (false).
func (g *Guard) follow(cb *combiner, l *line, key string, m *member) bool {
	r := m.r
	wait := time.NewTimer(max(0, r.wait-time.Since(m.arrived)))
	defer wait.Stop()
	var msg message
	select {
	case msg = <-m.msgs:
	case <-m.ctx.Done():
		if cb.leave(l, key, m) {
			abort(m.c, answerClientGone, r.retryAfter)
			return false
		}
		msg = <-m.msgs // taken into a batch meanwhile: it says what next
	case <-wait.C:
		if cb.leave(l, key, m) {
			if m.ctx.Err() != nil {
				// The client went away as the wait ran out: it is not
				// busy.
				abort(m.c, answerClientGone, r.retryAfter)
				return false
			}
			method, routeName := routeOf(m.c)
			g.metrics.busy.WithLabelValues(method, routeName).Inc()
			abortBusy(m.c, r)
			return false
		}
		msg = <-m.msgs
	}
	switch msg.kind {
	case msgLead:
		return true
	case msgSkip:
		abort(m.c, answerClientGone, r.retryAfter)
		return false
	case msgOutcome:
		// Taken into a batch that failed before this request's turn.
		m.answer(msg.err)
		return false
	}
	// msgRun: this request's turn in the batch of another.
	m.done <- m.turn(msg.ctx, key)
	out := <-m.msgs
	m.answer(out.err)
	return false
}

// leave takes m out of the line; false when a leader took it first.
func (cb *combiner) leave(l *line, key string, m *member) bool {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	for i, w := range l.waiting {
		if w == m {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			noteWaiting(key, len(l.waiting))
			return true
		}
	}
	return false
}

// take moves up to n waiting requests of the line into a batch.
func (cb *combiner) take(l *line, n int) []*member {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	n = min(n, len(l.waiting))
	out := append([]*member(nil), l.waiting[:n]...)
	l.waiting = append(l.waiting[:0], l.waiting[n:]...)
	return out
}

// close ends the batch's intake: the first waiting request, if any, is
// handed the lead of the next batch (it starts waiting for the lock at
// once, in the lock's own line, so that turns between instances go on as
// they do without combining); else the line closes, and the next request
// to arrive leads.
func (cb *combiner) close(l *line, key string) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if len(l.waiting) == 0 {
		l.open = false
		if cb.lines[key] == l {
			delete(cb.lines, key)
		}
		return
	}
	next := l.waiting[0]
	l.waiting = l.waiting[1:]
	next.msgs <- message{kind: msgLead}
}

// lead takes the lock for a batch that m begins, runs the batch and
// answers m.
func (g *Guard) lead(cb *combiner, l *line, key string, m *member, lockOpts []lock.LockOption) {
	r := m.r
	closed := false
	closeOnce := func() {
		if !closed {
			closed = true
			cb.close(l, key)
		}
	}
	defer closeOnce() // also when the leader panics

	h, ok := g.takeLock(m.c, r, key, true, func(mu *lock.Mutex) (context.Context, error) {
		return g.holdFor(m, mu, max(0, r.wait-time.Since(m.arrived)), lockOpts)
	}, func() {
		// FailOpen: this request alone, in a Session of its own.
		closeOnce()
		g.runBatch(cb, l, key, m, m.ctx, func() {}, closeOnce, false)
	})
	if !ok {
		closeOnce()
		return
	}
	g.runBatch(cb, l, key, m, h.ctx, h.release, closeOnce, true)
}

// holdFor takes the lock for a batch led by m, waiting at most wait. The
// hold must not end with m's request, which the batch outlives when m goes
// away during its turn: it is taken with a context of its own, which m's
// request ending cancels only while the lock is being waited for.
func (g *Guard) holdFor(m *member, mu *lock.Mutex, wait time.Duration, opts []lock.LockOption) (context.Context, error) {
	return takeBeyond(m.ctx, context.Background(), func(ctx context.Context) (context.Context, error) {
		return mu.TryLock(ctx, wait, opts...)
	}, func(hold context.Context) { _ = mu.Unlock(hold) })
}

// runBatch runs the batch that m leads under hold: m's own turn first, then
// those of the requests that wait, until the batch is full, its time is up
// or nobody waits; then it ends the Session's work, lets the lock go
// (unlock), and sends every member its outcome.
func (g *Guard) runBatch(cb *combiner, l *line, key string, m *member, hold context.Context, unlock, closeIntake func(), locked bool) {
	r := m.r
	method, routeName := routeOf(m.c)
	b := &batch{s: r.session, hold: hold, locked: locked}
	over := false // the batch is over: what panics now is m's own answer
	defer func() {
		if v := recover(); v != nil {
			if over {
				panic(v)
			}
			// The Session itself panicked: nothing of the batch is kept.
			if m.w != nil {
				m.w.discard()
			}
			closeIntake()
			b.end(false)
			unlock()
			for _, o := range b.members[1:] {
				o.msgs <- message{kind: msgOutcome, err: fmt.Errorf("%w: %v", ErrBatchFailed, v)}
			}
			panic(v)
		}
	}()
	b.members = []*member{m}
	started := time.Now()
	failed := b.run(m, key, true)
	for i := 1; failed == nil; i++ {
		if i == len(b.members) {
			if !locked || len(b.members) >= r.maxBatch || time.Since(started) >= r.maxBatchTime {
				break
			}
			// One at a time, so that the time bound is met to the request.
			more := cb.take(l, 1)
			if len(more) == 0 {
				break
			}
			b.members = append(b.members, more...)
		}
		o := b.members[i]
		if o.ctx.Err() != nil {
			o.msgs <- message{kind: msgSkip}
			b.members = append(b.members[:i], b.members[i+1:]...)
			i--
			continue
		}
		failed = b.run(o, key, false)
	}
	// The intake closes before the commit: the next batch's leader waits
	// for the lock in the lock's own line while this one commits.
	closeIntake()
	if failed == nil {
		failed = b.end(b.kept > 0)
	} else {
		b.end(false)
	}
	unlock()
	n := len(b.members)
	g.metrics.batchSize.WithLabelValues(method, routeName).Observe(float64(n))
	g.metrics.combined.WithLabelValues(method, routeName).Add(float64(n - 1))
	for _, o := range b.members[1:] {
		o.msgs <- message{kind: msgOutcome, err: failed}
	}
	over = true
	m.answer(failed)
}

// A batch is the state of one batch while its leader runs it.
type batch struct {
	s       Session
	locked  bool // false: a request run alone without the lock (FailOpen)
	hold    context.Context
	ctx     context.Context // the Session's work; nil until begun
	members []*member
	kept    int // members whose part the work keeps
	marks   int // savepoints made
}

// run gives member o its turn in the batch (the leader's own runs in its
// goroutine) and keeps or undoes its part. A non-nil error fails the whole
// batch: the Session failed or the lock is lost.
func (b *batch) run(o *member, key string, self bool) error {
	if b.ctx == nil {
		ctx, err := b.s.Begin(b.hold)
		if err != nil {
			return b.failure(err)
		}
		b.ctx = ctx
	}
	// A savepoint only when there is a part to keep before this one; a
	// failed part with nothing before it undoes the whole work instead.
	mark := ""
	if b.kept > 0 {
		b.marks++
		mark = "seckillguard_" + strconv.Itoa(b.marks)
		if err := b.s.Savepoint(b.ctx, mark); err != nil {
			return b.failure(err)
		}
	}
	var rep turnReport
	if !b.locked {
		key = ""
	}
	if self {
		rep = o.turn(b.ctx, key)
	} else {
		o.msgs <- message{kind: msgRun, ctx: b.ctx}
		rep = <-o.done
	}
	switch {
	case rep.stale || Lost(b.hold):
		return b.failure(nil)
	case rep.ok:
		b.kept++
		return nil
	case mark != "":
		if err := b.s.RollbackTo(b.ctx, mark); err != nil {
			return b.failure(err)
		}
		return nil
	}
	// Nothing kept before this part: undo the work, begin afresh for the
	// next.
	err := b.s.End(b.ctx, false)
	b.ctx = nil
	if err != nil {
		return b.failure(err)
	}
	return nil
}

// failure is the error the members of a failed batch are answered with.
func (b *batch) failure(err error) error {
	switch {
	case Lost(b.hold):
		return fmt.Errorf("%w (%w)", lock.ErrLost, context.Cause(b.hold))
	case errors.Is(err, fencing.ErrStale):
		return err
	case err == nil:
		return fencing.ErrStale
	}
	return fmt.Errorf("%w: %w", ErrBatchFailed, err)
}

// end ends the Session's work, committing it when commit is set.
func (b *batch) end(commit bool) error {
	if b.ctx == nil {
		return nil
	}
	err := b.s.End(b.ctx, commit)
	b.ctx = nil
	if err != nil {
		return b.failure(err)
	}
	return nil
}

// turn runs the handler of the request m in the batch whose work is in
// batchCtx, with m's answer held back, and reports how it went. It runs in
// m's goroutine; a panic of the handler is kept and raised again when m
// answers. key is "" for a request run without the lock (FailOpen).
func (m *member) turn(batchCtx context.Context, key string) (rep turnReport) {
	c := m.c
	ctx, cancel := context.WithCancelCause(batchCtx)
	stop := context.AfterFunc(m.ctx, func() { cancel(context.Cause(m.ctx)) })
	tc := &turnContext{Context: ctx, request: m.ctx}
	m.orig = c.Request
	c.Request = m.orig.WithContext(tc)
	if key != "" {
		m.st.lockKey, m.st.locks = key, m.g.locks
	}
	prevHolder, hadHolder := c.Get(fencing.ContextKey)
	c.Set(fencing.ContextKey, tc)
	m.w = holdAnswer(c)
	m.hooks = new([]func())
	c.Set(commitHooksName, m.hooks)
	defer func() {
		// c.Request is set back before the turn's context ends: what
		// watches c itself as a context (ContextWithFallback) and is woken
		// by that end reads c.Request after this write.
		c.Request = m.orig
		stop()
		cancel(nil)
		if hadHolder {
			c.Set(fencing.ContextKey, prevHolder)
		} else {
			c.Delete(fencing.ContextKey)
		}
		if v := recover(); v != nil {
			m.panicked, m.hadPanic = v, true
			rep.ok = false
		}
		for _, e := range c.Errors {
			if errors.Is(e.Err, fencing.ErrStale) {
				rep.stale = true
			}
		}
	}()
	m.g.runHandler(c, m.next)
	rep.ok = m.w.Status() < 400
	return rep
}

// answer writes m's answer once its batch is over: the held answer when
// the batch committed (err nil), else the batch's failure. It raises
// again a panic of m's handler.
func (m *member) answer(err error) {
	g, c := m.g, m.c
	method, routeName := routeOf(c)
	c.Delete(commitHooksName)
	if err == nil && m.hooks != nil {
		for _, f := range *m.hooks {
			f()
		}
	}
	if m.hadPanic {
		m.w.discard()
		panic(m.panicked)
	}
	if err == nil {
		m.w.release()
		return
	}
	if m.w != nil {
		m.w.discard()
	}
	// The work did not happen as the client asked: the request's
	// idempotency record must not make a retry replay it.
	m.st.unrepeatable = true
	stale := errors.Is(err, fencing.ErrStale)
	if stale {
		g.metrics.stale.WithLabelValues(method, routeName).Inc()
	}
	_ = c.Error(err)
	switch {
	case errors.Is(err, lock.ErrLost):
		abort(c, answerLockLost, m.r.retryAfter)
	case stale:
		abort(c, answerStaleWrite, m.r.retryAfter)
	default:
		g.log.ErrorContext(m.ctx, "guard: a batch's work failed; its requests are answered 503", "route", routeName, "err", err)
		abort(c, answerBatchFailed, m.r.retryAfter)
	}
}

// A turnContext is the request context of a handler in a batch: cancelled
// when the request ends or the lock is lost, with the lock's and the
// Session's values first and the request's own values (its logger's
// attributes, its trace) after them.
type turnContext struct {
	context.Context                 // the batch's, with the request's end as a cause
	request         context.Context // for the request's own values
}

func (t *turnContext) Value(key any) any {
	if v := t.Context.Value(key); v != nil {
		return v
	}
	return t.request.Value(key)
}
