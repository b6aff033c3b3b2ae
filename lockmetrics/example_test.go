package lockmetrics_test

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/lockmetrics"
)

// The lock metrics of a lock Client of one's own, without the HTTP layer.
// A Guard measures its own lock Client in its Collector; to put both in
// one registry, give the Guard these metrics (guard.WithLockMetrics).
func Example() {
	m := lockmetrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)

	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb, lock.WithObserver(m.Observe))
	defer locks.Close()
	// seckillguard_lock_events_total{kind,event},
	// seckillguard_lock_acquire_wait_seconds{kind},
	// seckillguard_lock_held_seconds{kind}
}
