// Package lockmetrics turns the events of lock Clients (lock.WithObserver)
// into Prometheus series. It depends on package lock and the Prometheus
// client only, so a service that uses locks without Gin measures them
// without importing Gin.
//
//	m := lockmetrics.New()
//	reg.MustRegister(m)
//	locks := lock.New(rdb, lock.WithObserver(m.Observe))
//
// The series are labelled by the kind of lock and the event, never by the
// lock's name (names derived from requests are unbounded), and every series
// exists from the start, at zero:
//
//   - seckillguard_lock_events_total{kind,event}: the events of the holds.
//   - seckillguard_lock_acquire_wait_seconds{kind}: how long first
//     acquisitions took, waiting included.
//   - seckillguard_lock_held_seconds{kind}: how long holds lasted as the
//     Client sees them, from sending the acquisition to the end of the hold
//     (its release done, or its loss found): the handler's time under the
//     lock plus the acquisition's and the release's round trips. A Guard's
//     seckillguard_lock_hold_seconds{method,route} is the handler's part
//     alone, so on a fast handler it is several times smaller.
//
// One Metrics may observe any number of Clients: their events add up in
// the same series. A guard.Guard measures its own lock Client with a
// Metrics of its own, in its Collector: register g.Collector() and do not
// give the Guard's Client another Metrics through guard.WithLockOptions
// (both would describe the same series, and the registry refuses the
// second). To measure a Guard's Client and Clients of your own in one
// registry, give the Guard your Metrics with guard.WithLockMetrics: the
// Guard's Client then reports to it, and g.Collector() leaves these series
// to it.
package lockmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckillguard/seckillguard/lock"
)

// Metrics is a prometheus.Collector of the events of the lock Clients that
// report to its Observe. It is safe for concurrent use.
type Metrics struct {
	events *prometheus.CounterVec
	wait   *prometheus.HistogramVec
	held   *prometheus.HistogramVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns Metrics with every series at zero.
func New() *Metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckillguard", Name: "lock_events_total",
			Help: "Events of the lock Client's holds, by kind of lock and event: acquired, handed_over, renewed, lost, released, released_later.",
		}, []string{"kind", "event"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "seckillguard", Name: "lock_acquire_wait_seconds", Buckets: buckets,
			Help: "How long first acquisitions took, waiting included, by kind of lock.",
		}, []string{"kind"}),
		held: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "seckillguard", Name: "lock_held_seconds", Buckets: buckets,
			Help: "How long holds lasted as the lock Client sees them, by kind of lock: from sending the acquisition to the release done or the loss found " +
				"(round trips included; the Guard's seckillguard_lock_hold_seconds is the handler's part alone).",
		}, []string{"kind"}),
	}
	for _, k := range lock.Kinds() {
		for _, e := range lock.EventTypes() {
			m.events.WithLabelValues(string(k), e.String())
		}
		m.wait.WithLabelValues(string(k))
		m.held.WithLabelValues(string(k))
	}
	return m
}

// Observe records e; pass it to lock.WithObserver.
func (m *Metrics) Observe(e lock.Event) {
	kind := string(e.Kind)
	m.events.WithLabelValues(kind, e.Type.String()).Inc()
	switch e.Type {
	case lock.EventAcquired:
		m.wait.WithLabelValues(kind).Observe(e.Wait.Seconds())
	case lock.EventReleased, lock.EventReleasedLater, lock.EventLost:
		m.held.WithLabelValues(kind).Observe(e.Held.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.events.Describe(ch)
	m.wait.Describe(ch)
	m.held.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.events.Collect(ch)
	m.wait.Collect(ch)
	m.held.Collect(ch)
}
