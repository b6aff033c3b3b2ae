package guard_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// stepKey marks the context a stepLog hook returns, with the step's name.
type stepKey struct{}

// stepLog is a StepHook that records each step's start and end.
type stepLog struct {
	mu    sync.Mutex
	lines []string
	ends  []guard.StepResult
}

func (l *stepLog) hook(ctx context.Context, s guard.StepInfo) (context.Context, func(guard.StepResult)) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf("start %s %s %s key=%q", s.Step, s.Method, s.Route, s.Key))
	l.mu.Unlock()
	return context.WithValue(ctx, stepKey{}, s.Step.String()), func(r guard.StepResult) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, fmt.Sprintf("end %s %s", s.Step, r.Outcome))
		l.ends = append(l.ends, r)
	}
}

// take returns the lines recorded so far and forgets them.
func (l *stepLog) take() ([]string, []guard.StepResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines, ends := l.lines, l.ends
	l.lines, l.ends = nil, nil
	return lines, ends
}

func sameLines(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: steps\n\t%s\nwant\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestStepHook_ALockedRouteReportsTheLockThenTheHandler: a Lock route
// reports StepLock (acquired, with its token and wait) and then StepHandler,
// whose context is the handler's request context; a busy key reports
// StepLock busy and no handler.
func TestStepHook_ALockedRouteReportsTheLockThenTheHandler(t *testing.T) {
	srv := testenv.Redis(t)
	var log stepLog
	release := make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Lock("sku:<sku>", guard.Wait(50*time.Millisecond)), func(c *gin.Context) {
			step, _ := c.Request.Context().Value(stepKey{}).(string)
			if c.Query("hold") != "" {
				<-release
			}
			c.String(http.StatusCreated, step)
		})
	}, guard.WithStepHook(log.hook))

	r := do(t, http.MethodPost, in.srv.URL+"/buy/42", "")
	if r.status != http.StatusCreated || string(r.body) != "handler" {
		t.Fatalf("POST /buy/42: %d %q, want 201 from a handler whose context is StepHandler's", r.status, r.body)
	}
	lines, ends := log.take()
	sameLines(t, "uncontended", lines,
		`start lock POST /buy/:sku key="sku:42"`, "end lock acquired",
		`start handler POST /buy/:sku key=""`, "end handler ok")
	if len(ends) == 2 && (ends[0].Token <= 0 || ends[0].Wait <= 0 || ends[1].Status != http.StatusCreated) {
		t.Errorf("results %+v, want the lock's token and wait, then the handler's 201", ends)
	}

	held := make(chan reply, 1)
	go func() { held <- do(t, http.MethodPost, in.srv.URL+"/buy/7?hold=1", "") }()
	eventually(t, func() bool {
		n, _ := in.rdb.Exists(context.Background(), "sku:7").Result()
		return n == 1
	})
	if r := do(t, http.MethodPost, in.srv.URL+"/buy/7", ""); r.status != http.StatusTooManyRequests {
		t.Fatalf("POST /buy/7 while held: %d, want 429", r.status)
	}
	close(release)
	<-held
	lines, ends = log.take()
	busy := -1
	for i, l := range lines {
		if l == "end lock busy" {
			busy = i
		}
	}
	if busy < 0 || len(lines) != 6 {
		t.Fatalf("contended: steps\n\t%s\nwant one request's lock busy among the other's four", strings.Join(lines, "\n\t"))
	}
	for _, e := range ends {
		if e.Outcome == guard.OutcomeBusy && (e.Wait < 50*time.Millisecond || e.Err == nil) {
			t.Errorf("busy result %+v, want the route's wait of 50ms at least and the error", e)
		}
	}
}

// TestStepHook_IdempotencyBeginsRunsAndFinishesThenReplays: an Idempotent
// route reports begin (execute), handler, finish (stored) for the first
// request with a key, and begin (replay), replay (replayed) for the retry.
func TestStepHook_IdempotencyBeginsRunsAndFinishesThenReplays(t *testing.T) {
	srv := testenv.Redis(t)
	var log stepLog
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/pay", g.Idempotent(guard.Unscoped()), func(c *gin.Context) { c.String(http.StatusOK, "paid") })
	}, guard.WithStepHook(log.hook))
	key := "steps-" + t.Name()
	for range 2 {
		if r := do(t, http.MethodPost, in.srv.URL+"/pay", "", "Idempotency-Key", key); r.status != http.StatusOK {
			t.Fatalf("POST /pay: %d %s", r.status, r.body)
		}
	}
	lines, ends := log.take()
	sameLines(t, "a request and its retry", lines,
		`start idempotency_begin POST /pay key=""`, "end idempotency_begin execute",
		`start handler POST /pay key=""`, "end handler ok",
		`start idempotency_finish POST /pay key=""`, "end idempotency_finish stored",
		`start idempotency_begin POST /pay key=""`, "end idempotency_begin replay",
		`start idempotency_replay POST /pay key=""`, "end idempotency_replay replayed")
	if len(ends) == 5 && ends[4].Status != http.StatusOK {
		t.Errorf("replay result %+v, want status 200", ends[4])
	}
}

// TestStepHook_APolicyWithBothReportsOneHandler: a policy with idempotency
// and a lock reports begin, lock, one handler step, finish; and a handler
// that panics ends its step as a panic.
func TestStepHook_APolicyWithBothReportsOneHandler(t *testing.T) {
	srv := testenv.Redis(t)
	var log stepLog
	pol, err := guard.ParsePolicies("p.yaml", []byte("routes:\n  - route: POST /o/:id\n    lock: \"o:<id>\"\n    idempotency:\n      unscoped: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Policies(pol))
		r.POST("/o/:id", func(c *gin.Context) {
			if c.Param("id") == "boom" {
				panic("boom")
			}
			c.Status(http.StatusNoContent)
		})
	}, guard.WithStepHook(log.hook))
	if r := do(t, http.MethodPost, in.srv.URL+"/o/1", "", "Idempotency-Key", "k-"+t.Name()); r.status != http.StatusNoContent {
		t.Fatalf("POST /o/1: %d %s", r.status, r.body)
	}
	lines, _ := log.take()
	sameLines(t, "a policy with both", lines,
		`start idempotency_begin POST /o/:id key=""`, "end idempotency_begin execute",
		`start lock POST /o/:id key="o:1"`, "end lock acquired",
		`start handler POST /o/:id key=""`, "end handler ok",
		`start idempotency_finish POST /o/:id key=""`, "end idempotency_finish stored")
	if r := do(t, http.MethodPost, in.srv.URL+"/o/boom", "", "Idempotency-Key", "boom-"+t.Name()); r.status != http.StatusInternalServerError {
		t.Fatalf("POST /o/boom: %d, want 500 from the recovery", r.status)
	}
	lines, _ = log.take()
	sameLines(t, "a panic", lines,
		`start idempotency_begin POST /o/:id key=""`, "end idempotency_begin execute",
		`start lock POST /o/:id key="o:boom"`, "end lock acquired",
		`start handler POST /o/:id key=""`, "end handler panic",
		`start idempotency_finish POST /o/:id key=""`, "end idempotency_finish dropped")
}
