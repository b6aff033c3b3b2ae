package sgotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/sgotel"
)

func init() { gin.SetMode(gin.TestMode) }

// redisAddr is the Redis the tests use: REDIS_ADDR (see TestMain). Every
// key a test makes starts with a prefix of its own (see prefix) and is
// removed when it ends.
func redisAddr() string { return os.Getenv("REDIS_ADDR") }

// prefix returns a key prefix unique to t and this run, and removes every
// key under it when t ends.
func prefix(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	p := fmt.Sprintf("sgotel-test:%d:%d:%s", os.Getpid(), time.Now().UnixNano(), t.Name())
	t.Cleanup(func() { dropKeys(rdb, p+"*") })
	return p
}

func dropKeys(rdb *redis.Client, pattern string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, pattern, 100).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

func newRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", redisAddr(), err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newProvider returns a TracerProvider that records ended spans in memory.
func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// names returns the names of spans, in the order they ended.
func names(spans []sdktrace.ReadOnlySpan) string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return strings.Join(out, " ")
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func str(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	v, _ := attr(s, k)
	return v.AsString()
}

func find(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// childOf reports whether s is a child of parent.
func childOf(s, parent sdktrace.ReadOnlySpan) bool {
	return s.Parent().SpanID() == parent.SpanContext().SpanID() && s.SpanContext().TraceID() == parent.SpanContext().TraceID()
}

// TestLockTracer_AnUncontendedLockIsAWaitThenAHold: Lock and Unlock under a
// request's span end "lock.wait" (acquired, with the token) then
// "lock.hold" (released), both children of that span; the lock's name is
// on them only with WithLockName.
func TestLockTracer_AnUncontendedLockIsAWaitThenAHold(t *testing.T) {
	rdb := newRedis(t)
	p := prefix(t, rdb)
	for _, withName := range []bool{false, true} {
		tp, rec := newProvider(t)
		opts := []sgotel.Option{sgotel.WithTracerProvider(tp)}
		if withName {
			opts = append(opts, sgotel.WithLockName())
		}
		tr := sgotel.NewLockTracer(opts...)
		c := lock.New(rdb, lock.WithNamespace(p), lock.WithObserver(tr.Observe))
		t.Cleanup(func() { c.Close() })
		ctx, req := tp.Tracer("test").Start(context.Background(), "request")
		held, err := c.Mutex("sku:42").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := fencing.FromContext(held)
		if err := c.Mutex("sku:42").Unlock(held); err != nil {
			t.Fatal(err)
		}
		req.End()
		spans := rec.Ended()
		if got := names(spans); got != "lock.wait lock.hold request" {
			t.Fatalf("spans %q, want lock.wait lock.hold request", got)
		}
		wait, hold, parent := spans[0], spans[1], spans[2]
		for _, s := range []sdktrace.ReadOnlySpan{wait, hold} {
			if !childOf(s, parent) {
				t.Errorf("%s is not a child of the request's span", s.Name())
			}
			if v, _ := attr(s, sgotel.AttrToken); v.AsInt64() != int64(tok) || str(s, sgotel.AttrLockKind) != "mutex" {
				t.Errorf("%s: token %v kind %q, want %d and mutex", s.Name(), v.AsInt64(), str(s, sgotel.AttrLockKind), tok)
			}
			if name, ok := attr(s, sgotel.AttrLockName); ok != withName || ok && name.AsString() != c.Key("sku:42") {
				t.Errorf("%s (WithLockName %v): lock name %q set %v", s.Name(), withName, name.AsString(), ok)
			}
			if s.Status().Code == codes.Error {
				t.Errorf("%s: status %v", s.Name(), s.Status())
			}
		}
		if str(wait, sgotel.AttrOutcome) != "acquired" || str(hold, sgotel.AttrOutcome) != "released" {
			t.Errorf("outcomes %q, %q, want acquired, released", str(wait, sgotel.AttrOutcome), str(hold, sgotel.AttrOutcome))
		}
		if _, ok := attr(wait, sgotel.AttrWait); !ok || wait.EndTime().After(hold.StartTime()) {
			t.Errorf("lock.wait has no wait or ends (%v) after the hold starts (%v)", wait.EndTime(), hold.StartTime())
		}
	}
}

// TestLockTracer_AWaitBehindAnotherHolderLastsTheWait: a Client that waits
// for another's lock ends a "lock.wait" span as long as the wait, then its
// "lock.hold" span once it unlocks.
func TestLockTracer_AWaitBehindAnotherHolderLastsTheWait(t *testing.T) {
	rdb := newRedis(t)
	p := prefix(t, rdb)
	tp, rec := newProvider(t)
	holder := lock.New(rdb, lock.WithNamespace(p))
	waiter := lock.New(rdb, lock.WithNamespace(p), lock.WithObserver(sgotel.NewLockTracer(sgotel.WithTracerProvider(tp)).Observe))
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	first, err := holder.Mutex("sku:7").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const hold = 300 * time.Millisecond
	unlocked := make(chan time.Time, 1)
	go func() {
		time.Sleep(hold)
		unlocked <- time.Now()
		holder.Mutex("sku:7").Unlock(first)
	}()
	ctx, req := tp.Tracer("test").Start(context.Background(), "request")
	start := time.Now()
	held, err := waiter.Mutex("sku:7").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	if len(rec.Ended()) != 1 || rec.Ended()[0].Name() != "lock.wait" {
		t.Fatalf("spans ended once the lock was taken: %q, want lock.wait", names(rec.Ended()))
	}
	waiter.Mutex("sku:7").Unlock(held)
	req.End()
	spans := rec.Ended()
	if got := names(spans); got != "lock.wait lock.hold request" {
		t.Fatalf("spans %q, want lock.wait lock.hold request", got)
	}
	w := spans[0]
	at := <-unlocked
	if d := w.EndTime().Sub(w.StartTime()); w.StartTime().After(at) || w.EndTime().Before(at) || d > waited {
		t.Errorf("lock.wait from %v to %v (%v), want it to span the holder's unlock at %v and last no more than the %v waited",
			w.StartTime(), w.EndTime(), d, at, waited)
	}
	if v, _ := attr(w, sgotel.AttrWait); v.AsFloat64() <= 0 || v.AsFloat64() > waited.Seconds() {
		t.Errorf("wait attribute %vs, want the wait, at most %v", v.AsFloat64(), waited)
	}
	if !childOf(w, spans[2]) || !childOf(spans[1], spans[2]) {
		t.Error("lock.wait and lock.hold are not children of the request's span")
	}
}

// TestLockTracer_ALossEndsTheHoldInError: a hold whose key is deleted is
// found lost by the watchdog; its "lock.hold" span ends with status Error,
// outcome lost, the cause recorded, and the renewals before it counted.
func TestLockTracer_ALossEndsTheHoldInError(t *testing.T) {
	rdb := newRedis(t)
	p := prefix(t, rdb)
	tp, rec := newProvider(t)
	renewed := make(chan struct{}, 100)
	c := lock.New(rdb, lock.WithNamespace(p), lock.WithWatchdogTimeout(300*time.Millisecond),
		lock.WithObserver(sgotel.NewLockTracer(sgotel.WithTracerProvider(tp)).Observe),
		lock.WithObserver(func(e lock.Event) {
			if e.Type == lock.EventRenewed {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}))
	t.Cleanup(func() { c.Close() })
	held, err := c.Mutex("sku:9").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-renewed: // the watchdog renews every 100ms
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal within 5s")
	}
	if err := rdb.Del(context.Background(), p+":sku:9").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the hold's context did not end within 5s of its key's deletion")
	}
	if !errors.Is(context.Cause(held), lock.ErrLost) {
		t.Fatalf("the hold ended with %v, want ErrLost", context.Cause(held))
	}
	spans := rec.Ended()
	if got := names(spans); got != "lock.wait lock.hold" {
		t.Fatalf("spans %q, want lock.wait lock.hold", got)
	}
	h := spans[1]
	if h.Status().Code != codes.Error || str(h, sgotel.AttrOutcome) != "lost" {
		t.Errorf("lock.hold: status %v outcome %q, want Error and lost", h.Status(), str(h, sgotel.AttrOutcome))
	}
	if ev := h.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("lock.hold events %v, want the cause recorded", ev)
	}
	if v, _ := attr(h, sgotel.AttrRenewals); v.AsInt64() < 1 {
		t.Errorf("renewals %d, want at least 1 before the loss", v.AsInt64())
	}
}

// TestStepHook_AGuardedGinRequestHasItsSteps: a request to a route with
// idempotency and a lock (a policy) is traced as its steps, children of the
// request's span, the handler's own span inside "guard.handler"; its retry
// as a begin and a replay; a request that finds the key busy as a
// "guard.lock" span in error.
func TestStepHook_AGuardedGinRequestHasItsSteps(t *testing.T) {
	rdb := newRedis(t)
	p := prefix(t, rdb)
	tp, rec := newProvider(t)
	pol, err := guard.ParsePolicies("p.yaml", []byte("routes:\n  - route: POST /buy/:sku\n    lock: \"sku:<sku>\"\n    wait: 50ms\n    idempotency:\n      unscoped: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(rdb, append(sgotel.GuardOptions(sgotel.WithTracerProvider(tp)), guard.WithLockOptions(lock.WithNamespace(p)))...)
	t.Cleanup(func() { g.Close() })
	records := make(chan string, 8)
	r := gin.New()
	r.Use(func(c *gin.Context) { // what an HTTP instrumentation does
		ctx, span := tp.Tracer("test").Start(c.Request.Context(), "request", trace.WithSpanKind(trace.SpanKindServer))
		c.Request = c.Request.WithContext(ctx)
		c.Next()
		span.End()
	})
	r.Use(g.Policies(pol))
	r.POST("/buy/:sku", func(c *gin.Context) {
		_, work := tp.Tracer("test").Start(c.Request.Context(), "work")
		work.End()
		if id, ok := guard.IdempotencyRecord(c); ok {
			records <- id
		}
		c.String(http.StatusCreated, "bought")
	})
	t.Cleanup(func() {
		close(records)
		for id := range records {
			rdb.Del(context.Background(), g.Locks().Key("seckillguard:idem:{"+id+"}")+":r") // the record, in the Guard's namespace
		}
	})
	post := func(sku, key string) int {
		req := httptest.NewRequest(http.MethodPost, "/buy/"+sku, nil)
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		return w.Code
	}
	key := p + "-first"
	if code := post("42", key); code != http.StatusCreated {
		t.Fatalf("POST /buy/42: %d", code)
	}
	spans := rec.Ended()
	// The idempotency record is taken by its own script, not a lock: the
	// only lock spans are the route lock's, between the record's begin and
	// finish.
	want := "guard.idempotency.begin lock.wait guard.lock work guard.handler lock.hold guard.idempotency.finish request"
	if got := names(spans); got != want {
		t.Fatalf("spans\n\t%s\nwant\n\t%s", got, want)
	}
	req := find(spans, "request")[0]
	for _, s := range spans[:len(spans)-1] {
		parent := req
		if s.Name() == "work" {
			parent = find(spans, "guard.handler")[0]
		}
		if !childOf(s, parent) {
			t.Errorf("%s is not a child of %s", s.Name(), parent.Name())
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s: status %v", s.Name(), s.Status())
		}
	}
	kinds := ""
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), "lock.") {
			kinds += str(s, sgotel.AttrLockKind) + " "
		}
	}
	if kinds != "mutex mutex " {
		t.Errorf("the lock spans' kinds %q, want the route's mutex only", kinds)
	}
	gl := find(spans, "guard.lock")[0]
	if tok, _ := attr(gl, sgotel.AttrToken); tok.AsInt64() <= 0 || str(gl, sgotel.AttrOutcome) != "acquired" ||
		str(gl, sgotel.AttrRoute) != "/buy/:sku" || str(gl, sgotel.AttrMethod) != http.MethodPost {
		t.Errorf("guard.lock attributes %v, want a token, outcome acquired, the route and method", gl.Attributes())
	}
	if _, ok := attr(gl, sgotel.AttrLockName); ok {
		t.Error("guard.lock carries the lock's name without WithLockName")
	}
	if h := find(spans, "guard.handler")[0]; str(h, sgotel.AttrOutcome) != "ok" {
		t.Errorf("guard.handler attributes %v, want outcome ok", h.Attributes())
	} else if v, _ := attr(h, sgotel.AttrStatus); v.AsInt64() != http.StatusCreated {
		t.Errorf("guard.handler status %d, want 201", v.AsInt64())
	}
	if f := find(spans, "guard.idempotency.finish")[0]; str(f, sgotel.AttrOutcome) != "stored" {
		t.Errorf("finish outcome %q, want stored", str(f, sgotel.AttrOutcome))
	}

	rec.Reset()
	if code := post("42", key); code != http.StatusCreated {
		t.Fatalf("the retry: %d, want the stored 201", code)
	}
	if got, want := names(rec.Ended()), "guard.idempotency.begin guard.idempotency.replay request"; got != want {
		t.Errorf("the retry's spans %q, want %q", got, want)
	}

	// Busy: the key held by another Client.
	other := lock.New(rdb, lock.WithNamespace(p))
	t.Cleanup(func() { other.Close() })
	held, err := other.Mutex("sku:7").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	if code := post("7", p+"-busy"); code != http.StatusTooManyRequests {
		t.Fatalf("POST /buy/7 while held: %d, want 429", code)
	}
	other.Mutex("sku:7").Unlock(held)
	busy := find(rec.Ended(), "guard.lock")
	if len(busy) != 1 || busy[0].Status().Code != codes.Error || str(busy[0], sgotel.AttrOutcome) != "busy" {
		t.Fatalf("spans %q; guard.lock %v, want one with status Error, outcome busy", names(rec.Ended()), busy)
	}
	if v, _ := attr(busy[0], sgotel.AttrWait); v.AsFloat64() < 0.05 {
		t.Errorf("busy wait %vs, want the route's 50ms at least", v.AsFloat64())
	}
	if got, want := names(rec.Ended()), "guard.idempotency.begin guard.lock guard.idempotency.finish request"; got != want {
		t.Errorf("a busy request's spans %q, want %q: no wait span of the mutex, no handler", got, want)
	}
}
