package guard

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckillguard/seckillguard/lock"
)

// LockMetrics turns the events of a lock Client (lock.WithObserver) into
// Prometheus series, labelled by the kind of lock and the event, never by
// the lock's name: seckillguard_lock_events_total{kind,event},
// seckillguard_lock_acquire_wait_seconds{kind} (how long first
// acquisitions took) and seckillguard_lock_held_seconds{kind} (how long
// holds lasted, released or lost). Every series exists from the start, at
// zero. A Guard feeds one of its own into its Collector; for a lock Client
// of your own:
//
//	m := guard.NewLockMetrics()
//	reg.MustRegister(m)
//	locks := lock.New(rdb, lock.WithObserver(m.Observe))
type LockMetrics struct {
	events *prometheus.CounterVec
	wait   *prometheus.HistogramVec
	held   *prometheus.HistogramVec
}

// NewLockMetrics returns LockMetrics with every series at zero.
func NewLockMetrics() *LockMetrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &LockMetrics{
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
			Help: "How long holds lasted until released or lost, by kind of lock.",
		}, []string{"kind"}),
	}
	for _, k := range lock.Kinds {
		for _, e := range lock.EventTypes {
			m.events.WithLabelValues(k, e.String())
		}
		m.wait.WithLabelValues(k)
		m.held.WithLabelValues(k)
	}
	return m
}

// Observe records e; pass it to lock.WithObserver.
func (m *LockMetrics) Observe(e lock.Event) {
	m.events.WithLabelValues(e.Kind, e.Type.String()).Inc()
	switch e.Type {
	case lock.EventAcquired:
		m.wait.WithLabelValues(e.Kind).Observe(e.Wait.Seconds())
	case lock.EventReleased, lock.EventReleasedLater, lock.EventLost:
		m.held.WithLabelValues(e.Kind).Observe(e.Held.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (m *LockMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.events.Describe(ch)
	m.wait.Describe(ch)
	m.held.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *LockMetrics) Collect(ch chan<- prometheus.Metric) {
	m.events.Collect(ch)
	m.wait.Collect(ch)
	m.held.Collect(ch)
}
