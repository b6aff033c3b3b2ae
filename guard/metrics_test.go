package guard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seckillguard/seckillguard/internal/testenv"
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
