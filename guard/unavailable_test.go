package guard_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// lockResults records how each StepLock ended.
type lockResults struct {
	mu  sync.Mutex
	got []guard.StepResult
}

func (l *lockResults) hook(ctx context.Context, s guard.StepInfo) (context.Context, func(guard.StepResult)) {
	return ctx, func(r guard.StepResult) {
		if s.Step == guard.StepLock {
			l.mu.Lock()
			l.got = append(l.got, r)
			l.mu.Unlock()
		}
	}
}

func (l *lockResults) last(t *testing.T) guard.StepResult {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.got) == 0 {
		t.Fatal("no StepLock ended")
	}
	return l.got[len(l.got)-1]
}

// Contention and an outage are told apart by the lock's errors: a lock held
// by another request is busy (ErrNotAcquired, never ErrUnavailable), an
// unreachable Redis is unavailable (ErrUnavailable, with go-redis's network
// error kept as its cause).
func TestLock_ContentionIsBusyAndAnOutageIsUnavailable(t *testing.T) {
	srv := testenv.Redis(t)
	var res lockResults
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:id", g.Lock("sku:<id>", guard.Wait(0)), func(c *gin.Context) { c.Status(204) })
	}, guard.WithStepHook(res.hook), guard.WithNamespace("shop"))
	in.rdb.Options().MaxRetries = -1

	other := lock.New(srv.Client(), lock.WithNamespace("shop"))
	defer other.Close()
	held, err := other.Mutex("sku:1").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r := do(t, "POST", in.srv.URL+"/buy/1", ""); r.status != 429 || r.errorCode() != "busy" {
		t.Errorf("lock held by another: %d %s, want 429 busy", r.status, r.body)
	}
	busy := res.last(t)
	if busy.Outcome != guard.OutcomeBusy || !errors.Is(busy.Err, lock.ErrNotAcquired) || errors.Is(busy.Err, lock.ErrUnavailable) {
		t.Errorf("busy: outcome %q, err %v; want busy, ErrNotAcquired and not ErrUnavailable", busy.Outcome, busy.Err)
	}
	if want := `lock "shop:sku:1": not acquired`; busy.Err == nil || busy.Err.Error() != want {
		t.Errorf("busy error reads %q, want %q", busy.Err, want)
	}
	other.Mutex("sku:1").Unlock(held)

	srv.Kill()
	if r := do(t, "POST", in.srv.URL+"/buy/2", ""); r.status != 503 || r.errorCode() != "lock_unavailable" {
		t.Errorf("Redis down: %d %s, want 503 lock_unavailable", r.status, r.body)
	}
	down := res.last(t)
	var op *net.OpError
	if down.Outcome != guard.OutcomeUnavailable || !errors.Is(down.Err, lock.ErrUnavailable) || !errors.As(down.Err, &op) || errors.Is(down.Err, lock.ErrNotAcquired) {
		t.Errorf("Redis down: outcome %q, err %v; want unavailable, ErrUnavailable with the network error kept", down.Outcome, down.Err)
	}
}

// A lock Client that cannot serve for another reason than an outage of
// Redis (it was closed) answers 503 but never makes a FailOpen route run
// unprotected: failing open is for an unreachable Redis only.
func TestLock_AClosedLockClientDoesNotFailOpen(t *testing.T) {
	srv := testenv.Redis(t)
	ran := 0
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		ok := func(c *gin.Context) { ran++; c.Status(204) }
		r.POST("/lock/:id", g.Lock("o:<id>", guard.FailOpen()), ok)
		r.POST("/idem", g.Idempotent(guard.Unscoped(), guard.WaitForFirst(time.Second), guard.FailOpen()), ok)
	})
	in.g.Locks().Close()
	if r := do(t, "POST", in.srv.URL+"/lock/1", ""); r.status != 503 || r.errorCode() != "lock_unavailable" {
		t.Errorf("lock route, lock Client closed: %d %s, want 503 lock_unavailable", r.status, r.body)
	}
	if r := do(t, "POST", in.srv.URL+"/idem", "", "Idempotency-Key", "k1"); r.status != 503 || r.errorCode() != "idempotency_unavailable" {
		t.Errorf("WaitForFirst route, lock Client closed: %d %s, want 503 idempotency_unavailable", r.status, r.body)
	}
	if ran != 0 {
		t.Errorf("the handler ran %d times unprotected with a closed lock Client", ran)
	}
}

// New refuses a lock Client that cannot work, by asking it (lock.Client.Err).
func TestNew_RefusesAnUnusableLockClient(t *testing.T) {
	srv := testenv.Redis(t)
	defer func() {
		p := recover()
		err, _ := p.(error)
		if !errors.Is(err, lock.ErrInvalid) {
			t.Fatalf("New with a bad watchdog timeout: panic %v, want one matching lock.ErrInvalid", p)
		}
	}()
	guard.New(srv.Client(), guard.WithLockOptions(lock.WithWatchdogTimeout(1)))
}
