package guard

import (
	"sync"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckillguard/seckillguard/lockmetrics"
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
	idem      *prometheus.CounterVec   // one outcome per request
	records   *prometheus.CounterVec   // one outcome per executed request
	locks     *lockmetrics.Metrics     // the lock Client's events
	ownLocks  bool                     // locks is the Guard's own, collected with the rest
	batchSize *prometheus.HistogramVec // Combining routes: requests per batch
	combined  *prometheus.CounterVec   // Combining routes: requests run under another's hold

	seen sync.Map // method + " " + route -> struct{}: series created at zero
}

// The bounded label values, each series of a route created at zero.
var (
	requestOutcomes = []string{"executed", "replayed", "in_progress", "mismatch"}
	recordOutcomes  = []string{"stored", "not_stored", "dropped"}
	redisModes      = []string{"closed", "open"}
)

var routeLabels = []string{"method", "route"}

// newMetrics returns the Guard's metrics; its lock Client reports to
// locks, or to lock metrics of the Guard's own when locks is nil, which
// then belong to the Guard's Collector.
func newMetrics(locks *lockmetrics.Metrics) *metrics {
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
	own := locks == nil
	if own {
		locks = lockmetrics.New()
	}
	return &metrics{
		locks:     locks,
		ownLocks:  own,
		acquired:  counter("lock_acquired_total", "Locks acquired by the lock middleware."),
		busy:      counter("lock_busy_total", "Requests answered busy: the key stayed locked for the whole wait."),
		lost:      counter("lock_lost_total", "Locks lost while their handler ran (lease ran out, expired, or deleted)."),
		stale:     counter("stale_writes_total", "Writes refused because their fencing token was stale."),
		rejected:  counter("rejected_total", "Requests refused before any lock: bad key fields, bodies, idempotency keys.", "error"),
		redisDown: counter("redis_unavailable_total", "Requests that met an unreachable Redis, by what was done: closed (503) or open (let through).", "mode"),
		wait:      hist("lock_wait_seconds", "Time spent waiting for the lock, for requests that got it."),
		hold: hist("lock_hold_seconds", "Time the handler (on combining routes: the batch) ran holding the route's lock, from the acquisition's return to the release's call; "+
			"the lock Client's seckillguard_lock_held_seconds adds the acquisition's and the release's round trips."),
		idem: counter("idempotency_requests_total", "Requests with an idempotency key, by outcome, one per request: executed (the handler ran), "+
			"replayed (answered from the store), in_progress (the first request still runs), mismatch (the key was used for another request).", "outcome"),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "seckillguard", Name: "batch_size", Help: "Requests per batch on combining routes, one observation per batch (a lone request is a batch of 1).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}, routeLabels),
		combined: counter("combined_requests_total", "Requests of combining routes run in a batch that another request of the same instance led, under its hold of the lock."),
		records: counter("idempotency_records_total", "What became of the answers of executed idempotent requests, one per execution: "+
			"stored (kept for replay), not_stored (too large, or the store failed), dropped (not storable: a 5xx, a lost lock, a panic).", "outcome"),
	}
}

// Collector returns the Guard's metrics as one prometheus.Collector, for the
// service to register on its own registry:
//
//	reg.MustRegister(g.Collector())
//
// It holds the lock series of the Guard's lock Client too (package
// lockmetrics), unless WithLockMetrics gave the Guard lock metrics that are
// registered on their own.
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
	all := []prometheus.Collector{m.acquired, m.busy, m.lost, m.stale, m.rejected, m.redisDown, m.wait, m.hold, m.idem, m.records, m.batchSize, m.combined}
	if m.ownLocks {
		all = append(all, m.locks)
	}
	return all
}

// touch creates every series of the route at zero, once, so that rates and
// sums over them are right from the first request.
func (m *metrics) touch(method, route string) {
	if _, done := m.seen.LoadOrStore(method+" "+route, struct{}{}); done {
		return
	}
	for _, c := range []*prometheus.CounterVec{m.acquired, m.busy, m.lost, m.stale} {
		c.WithLabelValues(method, route)
	}
	m.wait.WithLabelValues(method, route)
	m.hold.WithLabelValues(method, route)
	for _, mode := range redisModes {
		m.redisDown.WithLabelValues(method, route, mode)
	}
	for _, o := range requestOutcomes {
		m.idem.WithLabelValues(method, route, o)
	}
	for _, o := range recordOutcomes {
		m.records.WithLabelValues(method, route, o)
	}
}

// touchBatch creates the combining series of the route at zero, once.
func (m *metrics) touchBatch(method, route string) {
	if _, done := m.seen.LoadOrStore("batch "+method+" "+route, struct{}{}); done {
		return
	}
	m.batchSize.WithLabelValues(method, route)
	m.combined.WithLabelValues(method, route)
}

// routeOf returns the label values of c's route.
func routeOf(c *gin.Context) (method, route string) {
	route = c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	return c.Request.Method, route
}
