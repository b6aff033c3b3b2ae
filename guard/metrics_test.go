package guard_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/lockmetrics"
)

// series returns the counter values of family name by outcome label.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[label(m, "outcome")+label(m, "mode")] = m.GetCounter().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestMetrics_IdempotencyOutcomesNeverDoubleCountAndStartAtZero: one
// outcome per request in idempotency_requests_total and one per execution
// in idempotency_records_total, so neither sum counts a request twice; and
// every series of a route exists, at zero, from its first request.
func TestMetrics_IdempotencyOutcomesNeverDoubleCountAndStartAtZero(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	reg := prometheus.NewRegistry()
	reg.MustRegister(in.g.Collector())

	do(t, http.MethodPost, in.srv.URL+"/pay", `{"amount":10}`, "Idempotency-Key", `"k-1"`, "X-User-ID", "u1")
	do(t, http.MethodPost, in.srv.URL+"/pay", `{"amount":10}`, "Idempotency-Key", `"k-1"`, "X-User-ID", "u1")

	reqs := series(t, reg, "seckillguard_idempotency_requests_total")
	want := map[string]float64{"executed": 1, "replayed": 1, "in_progress": 0, "mismatch": 0}
	sum := 0.0
	for k, v := range reqs {
		sum += v
		if want[k] != v {
			t.Errorf("requests{outcome=%q} = %v, want %v", k, v, want[k])
		}
	}
	if len(reqs) != len(want) || sum != 2 {
		t.Errorf("requests by outcome %v: want every outcome present and a sum of 2 for 2 requests", reqs)
	}
	recs := series(t, reg, "seckillguard_idempotency_records_total")
	if recs["stored"] != 1 || recs["not_stored"] != 0 || recs["dropped"] != 0 || len(recs) != 3 {
		t.Errorf("records by outcome %v, want stored 1 and the others present at 0", recs)
	}
	fams, _ := reg.Gather()
	for _, f := range fams {
		if !strings.HasSuffix(f.GetName(), "_total") && !strings.HasSuffix(f.GetName(), "_seconds") {
			t.Errorf("metric %s: names end in _total or _seconds", f.GetName())
		}
	}
	if down := series(t, reg, "seckillguard_redis_unavailable_total"); len(down) != 2 || down["closed"] != 0 {
		t.Errorf("redis_unavailable by mode %v, want closed and open at 0", down)
	}
}

// TestLockMetrics_CountEventsByKindNeverByName: a Guard's Collector counts
// its lock Client's events by kind and event, with every series present
// from the start and no label holding a lock name.
func TestLockMetrics_CountEventsByKindNeverByName(t *testing.T) {
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Lock("sku:<sku>"), func(c *gin.Context) { c.Status(http.StatusNoContent) })
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(in.g.Collector())
	before, _ := reg.Gather()
	count := func(fams []*dto.MetricFamily, name string) (n int, acquired, released float64) {
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				n++
				for _, l := range m.GetLabel() {
					if strings.Contains(l.GetValue(), "sku:") {
						t.Errorf("label %s=%q holds a lock name", l.GetName(), l.GetValue())
					}
				}
				if label(m, "kind") == "mutex" && label(m, "event") == "acquired" {
					acquired = m.GetCounter().GetValue()
				}
				if label(m, "kind") == "mutex" && label(m, "event") == "released" {
					released = m.GetCounter().GetValue()
				}
			}
		}
		return
	}
	if n, _, _ := count(before, "seckillguard_lock_events_total"); n != len(lock.Kinds())*len(lock.EventTypes()) {
		t.Errorf("%d lock event series before any request, want all %d at zero", n, len(lock.Kinds())*len(lock.EventTypes()))
	}
	for i := range 3 {
		if r := do(t, http.MethodPost, in.srv.URL+"/buy/"+strconv.Itoa(i), ""); r.status != http.StatusNoContent {
			t.Fatalf("buy: %d", r.status)
		}
	}
	after, _ := reg.Gather()
	if _, acq, rel := count(after, "seckillguard_lock_events_total"); acq != 3 || rel != 3 {
		t.Errorf("mutex acquired %v, released %v; want 3 each", acq, rel)
	}
}

// A Guard and a lock Client of one's own share one registry: the Guard is
// given the lock metrics (WithLockMetrics), both Clients report to them, and
// g.Collector() leaves those series to them. Registering the Guard's
// Collector beside lock metrics used to fail: both described the same
// series.
func TestLockMetrics_AGuardAndALockClientOfYourOwnShareOneRegistry(t *testing.T) {
	srv := testenv.Redis(t)
	m := lockmetrics.New()
	own := lock.New(srv.Client(), lock.WithObserver(m.Observe))
	defer own.Close()
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Lock("sku:<sku>"), func(c *gin.Context) { c.Status(http.StatusNoContent) })
	}, guard.WithLockMetrics(m))
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{in.g.Collector(), m} {
		if err := reg.Register(c); err != nil {
			t.Fatalf("registering %T: %v", c, err)
		}
	}
	if r := do(t, http.MethodPost, in.srv.URL+"/buy/1", ""); r.status != http.StatusNoContent {
		t.Fatalf("buy: %d", r.status)
	}
	held, err := own.Mutex("job:1").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Mutex("job:1").Unlock(held); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var acquired, released, routeAcquired float64
	for _, f := range fams {
		for _, x := range f.GetMetric() {
			switch {
			case f.GetName() == "seckillguard_lock_events_total" && label(x, "kind") == "mutex" && label(x, "event") == "acquired":
				acquired = x.GetCounter().GetValue()
			case f.GetName() == "seckillguard_lock_events_total" && label(x, "kind") == "mutex" && label(x, "event") == "released":
				released = x.GetCounter().GetValue()
			case f.GetName() == "seckillguard_lock_acquired_total" && label(x, "route") == "/buy/:sku":
				routeAcquired = x.GetCounter().GetValue()
			}
		}
	}
	if acquired != 2 || released != 2 || routeAcquired != 1 {
		t.Errorf("mutex acquired %v, released %v, route acquisitions %v; want 2, 2 (the Guard's hold and the Client's, each counted once) and 1",
			acquired, released, routeAcquired)
	}
}
