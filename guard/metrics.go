package guard

import (
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Guard's Prometheus collectors. Every series is labelled by
// the request method and the route template as registered in gin
// ("/api/seckill/:sku"), never by a key or a path with values in it: label
// values stay bounded by the number of routes.
type metrics struct {
	acquired  *prometheus.CounterVec
	busy      *prometheus.CounterVec
	lost      *prometheus.CounterVec
	stale     *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	redisDown *prometheus.CounterVec
	wait      *prometheus.HistogramVec
	hold      *prometheus.HistogramVec
	idem      *prometheus.CounterVec
}

var routeLabels = []string{"method", "route"}

func newMetrics() *metrics {
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckillguard", Name: name, Help: help,
		}, append(append([]string(nil), routeLabels...), extra...))
	}
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "seckillguard", Name: name, Help: help, Buckets: buckets,
		}, routeLabels)
	}
	return &metrics{
		acquired:  counter("lock_acquired_total", "Locks acquired by the lock middleware."),
		busy:      counter("lock_busy_total", "Requests answered busy: the key stayed locked for the whole wait."),
		lost:      counter("lock_lost_total", "Locks lost while their handler ran (lease ran out, expired, or deleted)."),
		stale:     counter("stale_writes_total", "Writes refused because their fencing token was stale."),
		rejected:  counter("rejected_total", "Requests refused before any lock: bad key fields, bodies, idempotency keys.", "error"),
		redisDown: counter("redis_unavailable_total", "Requests that met an unreachable Redis, by what was done: closed (503) or open (let through).", "mode"),
		wait:      hist("lock_wait_seconds", "Time spent waiting for the lock, for requests that got it."),
		hold:      hist("lock_hold_seconds", "Time the lock was held around the handler."),
		idem:      counter("idempotency_total", "Idempotent requests by outcome: executed, replayed, in_progress, mismatch, stored, not_stored, dropped.", "outcome"),
	}
}

// Collector returns the Guard's metrics as one prometheus.Collector, for the
// service to register on its own registry:
//
//	reg.MustRegister(g.Collector())
func (g *Guard) Collector() prometheus.Collector { return g.metrics }

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all() {
		c.Collect(ch)
	}
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.acquired, m.busy, m.lost, m.stale, m.rejected, m.redisDown, m.wait, m.hold, m.idem}
}

// routeOf returns the label values of c's route.
func routeOf(c *gin.Context) (method, route string) {
	route = c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	return c.Request.Method, route
}
