package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// roundTrips is a go-redis hook that counts the calls a client makes to
// Redis: a command, or a pipeline of them, is one round trip.
type roundTrips struct {
	mu    sync.Mutex
	calls []string
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd.Name())
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		r.add("pipeline(" + strings.Join(names, " ") + ")")
		return next(ctx, cmds)
	}
}

func (r *roundTrips) add(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *roundTrips) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls[n:]...)
}

func (r *roundTrips) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// commandStats returns the calls of each command that the server has run,
// those run by scripts included (INFO commandstats).
func commandStats(t *testing.T, srv *testenv.RedisServer) map[string]int64 {
	t.Helper()
	info, _ := srv.Do("INFO", "commandstats").(string)
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// An idempotent request that runs its handler (the common case: a new key)
// costs Redis at most 8 commands, those its scripts run included, in at
// most 2 round trips: one before the handler (look the key up and mark it
// in progress) and one after (store the answer, if the marker is still
// this execution's).
func TestIdempotent_ANewKeyCostsAtMostEightCommandsInTwoRoundTrips(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	trips := &roundTrips{}
	in.rdb.AddHook(trips)
	// The first request loads the scripts.
	if r := do(t, "POST", in.srv.URL+"/pay", `{"amount":1}`, "Idempotency-Key", "warm-up", "X-User-ID", "u1"); r.status != 201 {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	for i := range 3 {
		before, n := commandStats(t, srv), trips.len()
		r := do(t, "POST", in.srv.URL+"/pay", `{"amount":1}`, "Idempotency-Key", fmt.Sprintf("k-%d", i), "X-User-ID", "u1")
		calls, after := trips.since(n), commandStats(t, srv)
		if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		var cmds int64
		var ran []string
		for name, v := range after {
			// INFO and the HELLO of its connection are the measurement's.
			if d := v - before[name]; d > 0 && name != "info" && name != "hello" {
				cmds += d
				ran = append(ran, fmt.Sprintf("%s=%d", name, d))
			}
		}
		t.Logf("request %d: %d commands (%s) in %d round trips (%s)", i, cmds, strings.Join(ran, " "), len(calls), strings.Join(calls, ", "))
		if cmds > 8 || len(calls) > 2 {
			t.Errorf("request %d: %d commands (%s) in %d round trips (%s); want at most 8 in at most 2",
				i, cmds, strings.Join(ran, " "), len(calls), strings.Join(calls, ", "))
		}
	}
	// The key's record is stored, and replayed by the first round trip.
	n := trips.len()
	r := do(t, "POST", in.srv.URL+"/pay", `{"amount":1}`, "Idempotency-Key", "k-0", "X-User-ID", "u1")
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || len(trips.since(n)) != 1 {
		t.Fatalf("replay: %d %s in %v", r.status, r.body, trips.since(n))
	}
}

// A handler that runs for several leases keeps its key: the Guard renews
// the in-progress marker, so a retry meanwhile is answered 409 and the
// handler runs once.
func TestIdempotent_LongHandlerKeepsItsKeyPastTheLease(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	release := make(chan struct{})
	var once sync.Once
	var entered atomic.Int32
	slow := func(c *gin.Context) {
		if entered.Add(1) == 1 {
			<-release
		}
		p.pay(c)
	}
	in := idemInstance(t, srv, slow, guard.InProgressLease(300*time.Millisecond))
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the server closes
	h := []string{"Idempotency-Key", "long", "X-User-ID", "u1"}
	first := make(chan reply, 1)
	go func() { first <- do(t, "POST", in.srv.URL+"/pay", `{}`, h...) }()
	eventually(t, func() bool { return len(recordsIn(t, in)) == 1 })
	for i := range 6 { // 6 × 200 ms: four leases, renewed every 100 ms
		time.Sleep(200 * time.Millisecond)
		if r := do(t, "POST", in.srv.URL+"/pay", `{}`, h...); r.status != 409 || r.errorCode() != "request_in_progress" {
			t.Fatalf("retry %d while the first runs (%v in): %d %s, want 409 request_in_progress", i, time.Duration(i+1)*200*time.Millisecond, r.status, r.body)
		}
	}
	once.Do(func() { close(release) })
	if r := <-first; r.status != 201 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", in.srv.URL+"/pay", `{}`, h...); r.status != 201 || r.header.Get(guard.ReplayedHeader) != "true" || p.runs.Load() != 1 {
		t.Fatalf("after the first: %d %s (runs %d), want its answer replayed", r.status, r.body, p.runs.Load())
	}
}

// A request whose in-progress marker is lost while its handler runs (here
// deleted; a failover or an eviction does the same) is told: its context
// is cancelled with cause lock.ErrLost, and its answer is not stored, so
// the retry runs.
func TestIdempotent_LostMarkerCancelsTheHandlerAndIsNotStored(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	cause := make(chan error, 1)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/pay", g.Idempotent(guard.Unscoped(), guard.InProgressLease(90*time.Millisecond)), func(c *gin.Context) {
			if runs.Add(1) == 1 {
				select {
				case <-c.Request.Context().Done():
					cause <- context.Cause(c.Request.Context())
				case <-time.After(5 * time.Second):
					cause <- nil
				}
			}
			c.JSON(201, gin.H{"run": runs.Load()})
		})
	})
	first := make(chan reply, 1)
	go func() { first <- do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "lost") }()
	eventually(t, func() bool { return len(recordsIn(t, in)) == 1 })
	for k := range recordsIn(t, in) {
		in.rdb.Del(context.Background(), k)
	}
	if err := <-cause; !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the handler's context after its marker was deleted: cause %v, want lock.ErrLost", err)
	}
	<-first
	if recs := recordsIn(t, in); len(recs) != 0 {
		t.Fatalf("the answer of a request whose key was lost was stored: %v", recs)
	}
	if r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "lost"); r.status != 201 || r.header.Get(guard.ReplayedHeader) != "" || runs.Load() != 2 {
		t.Fatalf("retry: %d %s (runs %d), want it to run", r.status, r.body, runs.Load())
	}
}

// On a route that WaitForFirst, a request holds its key by a semaphore
// permit, and its in-progress marker lives for the record's TTL: when the
// permit is lost while the handler runs (here its key is deleted, as a
// failover or an eviction would), the handler's context is cancelled, and
// its answer, produced after the request lost its hold on the key, is not
// stored although the marker is still its own; the retry runs.
func TestIdempotent_AnAnswerAfterTheKeysPermitWasLostIsNotStored(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	cause := make(chan error, 1)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/pay", g.Idempotent(guard.Unscoped(), guard.WaitForFirst(time.Second)), func(c *gin.Context) {
			if runs.Add(1) == 1 {
				close(entered)
				<-c.Request.Context().Done()
				cause <- context.Cause(c.Request.Context())
				<-release // it answers after the loss, not watching its context any more
			}
			c.JSON(http.StatusCreated, gin.H{"run": runs.Load()})
		})
	}, guard.WithLockOptions(lock.WithWatchdogTimeout(300*time.Millisecond)))
	first := make(chan reply, 1)
	go func() { first <- do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "permit") }()
	<-entered
	ctx := context.Background()
	keys, err := in.rdb.Keys(ctx, "*seckillguard:idem:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var marker string
	for _, k := range keys {
		if strings.HasSuffix(k, ":r") {
			marker = k
			continue
		}
		in.rdb.Del(ctx, k) // the permit's key, not the marker
	}
	if marker == "" {
		t.Fatalf("no marker among %v", keys)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, lock.ErrLost) {
			t.Fatalf("the handler's context ended with %v, want lock.ErrLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled after its permit was deleted")
	}
	if v, _ := in.rdb.Get(ctx, marker).Result(); !strings.HasPrefix(v, "p") {
		t.Fatalf("the marker is %q; the test needs it in place (the permit alone lost)", v)
	}
	close(release)
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if v, _ := in.rdb.Get(ctx, marker).Result(); strings.HasPrefix(v, "c") {
		t.Errorf("the answer given after the permit was lost was stored: %s", v)
	}
	if r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "permit"); r.status != http.StatusCreated || r.header.Get(guard.ReplayedHeader) != "" || runs.Load() != 2 {
		t.Errorf("retry: %d %s (replayed %q, runs %d); want it to run again", r.status, r.body, r.header.Get(guard.ReplayedHeader), runs.Load())
	}
}

// A renewal of an in-progress marker renews only its own execution's
// marker. Here the running request's marker is replaced meanwhile by
// another execution's stored answer (the first execution stalled past its
// lease, a second took the key over and finished): the first's next renewal
// finds the key another's, cancels the first's context (it no longer holds
// the key) and leaves the other's record alone, with its 24h TTL; a
// renewal that renewed whatever was there would let the stalled execution
// run on beside the other and cut the other's record down to the
// in-progress lease, so that a later retry would run a third time.
func TestIdempotent_ARenewalTouchesOnlyItsOwnMarker(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	cause := make(chan error, 1)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/pay", g.Idempotent(guard.Unscoped(), guard.InProgressLease(300*time.Millisecond)), func(c *gin.Context) {
			if runs.Add(1) == 1 {
				close(entered)
				select {
				case <-c.Request.Context().Done():
					cause <- context.Cause(c.Request.Context())
				case <-time.After(3 * time.Second):
					cause <- nil
				}
				<-release
			}
			c.JSON(http.StatusCreated, gin.H{"run": runs.Load()})
		})
	})
	first := make(chan reply, 1)
	go func() { first <- do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "renew") }()
	<-entered
	ctx := context.Background()
	recs := recordsIn(t, in)
	if len(recs) != 1 {
		t.Fatalf("records %v, want the running request's marker", recs)
	}
	var key, marker string
	for key, marker = range recs {
	}
	fp, _, _ := strings.Cut(strings.TrimPrefix(marker, "p"), ":")
	other := `c{"fp":"` + fp + `","status":201,"header":{"Content-Type":["application/json; charset=utf-8"]},"body":"eyJydW4iOiJvdGhlciJ9"}` // {"run":"other"}
	if err := in.rdb.Set(ctx, key, other, 24*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	err := <-cause
	close(release)
	<-first
	if !errors.Is(err, lock.ErrLost) {
		t.Errorf("the first execution's context after its key was taken over: cause %v, want lock.ErrLost", err)
	}
	if ttl, _ := in.rdb.PTTL(ctx, key).Result(); ttl < time.Hour {
		t.Errorf("the other execution's record lives %v after the first's renewals, want its 24h", ttl)
	}
	if r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "renew"); r.header.Get(guard.ReplayedHeader) != "true" || string(r.body) != `{"run":"other"}` || runs.Load() != 1 {
		t.Errorf("retry: %d %s (replayed %q, runs %d); want the other execution's answer replayed", r.status, r.body, r.header.Get(guard.ReplayedHeader), runs.Load())
	}
}
