package lockmetrics_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/lockmetrics"
)

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestMetrics_CountTheEventsOfEveryClientByKindNeverByName: one Metrics
// fed by two lock Clients counts the holds of both, by kind and event, with
// every series present at zero from the start and no label holding a lock
// name.
func TestMetrics_CountTheEventsOfEveryClientByKindNeverByName(t *testing.T) {
	srv := testenv.Redis(t)
	m := lockmetrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "seckillguard_lock_events_total" && len(f.GetMetric()) != len(lock.Kinds())*len(lock.EventTypes()) {
			t.Errorf("%d event series before any hold, want all %d at zero", len(f.GetMetric()), len(lock.Kinds())*len(lock.EventTypes()))
		}
	}
	ctx := context.Background()
	for i := range 2 {
		locks := lock.New(srv.Client(), lock.WithObserver(m.Observe))
		defer locks.Close()
		mu := locks.Mutex("job:" + string(rune('a'+i)))
		held, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := mu.Unlock(held); err != nil {
			t.Fatal(err)
		}
	}
	if fams, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	var acquired, released float64
	var heldCount uint64
	for _, f := range fams {
		for _, x := range f.GetMetric() {
			for _, l := range x.GetLabel() {
				if strings.Contains(l.GetValue(), "job:") {
					t.Errorf("label %s=%q holds a lock name", l.GetName(), l.GetValue())
				}
			}
			if label(x, "kind") != "mutex" {
				continue
			}
			switch f.GetName() {
			case "seckillguard_lock_events_total":
				switch label(x, "event") {
				case "acquired":
					acquired = x.GetCounter().GetValue()
				case "released":
					released = x.GetCounter().GetValue()
				}
			case "seckillguard_lock_held_seconds":
				heldCount = x.GetHistogram().GetSampleCount()
			}
		}
	}
	if acquired != 2 || released != 2 || heldCount != 2 {
		t.Errorf("acquired %v, released %v, holds measured %d; want 2 of each, one per Client", acquired, released, heldCount)
	}
}

// TestPackage_ImportsNoGin: a service that uses locks without Gin measures
// them without importing Gin (or anything of the HTTP layer).
func TestPackage_ImportsNoGin(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "gin-gonic") || strings.HasSuffix(dep, "/guard") || strings.HasSuffix(dep, "/ginmw") {
			t.Errorf("lockmetrics depends on %s", dep)
		}
	}
}
