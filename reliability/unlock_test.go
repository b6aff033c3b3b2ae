package reliability

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A request whose final Unlock fails (Redis unreachable for a moment as the
// handler returns) does not keep its key locked for longer than a lease,
// although guard never retries the Unlock: the lock retries the release in
// the background and renews nothing meanwhile.
func TestUnlockFailure_LockExpiresWithItsLease(t *testing.T) {
	const watchdog = time.Second
	srv := testenv.Redis(t)
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	g := guard.New(rdb, guard.WithLogger(quiet), guard.WithLockOptions(lock.WithWatchdogTimeout(watchdog)))
	defer g.Close()
	r := gin.New()
	r.POST("/buy/:sku", g.Lock("sku:<sku>", guard.Wait(0)), func(c *gin.Context) {
		if c.Query("cut") != "" {
			p.SetDrop(true) // the unlock after the handler fails
		}
		c.Status(http.StatusOK)
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/buy/1?cut=1", nil))
	p.SetDrop(false)
	if w.Code != http.StatusOK {
		t.Fatalf("first request: %d", w.Code)
	}
	deadline := time.Now().Add(3 * watchdog)
	for {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/buy/1", nil))
		if w.Code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			ttl, _ := srv.Client().PTTL(t.Context(), "sku:1").Result()
			t.Fatalf("sku:1 still locked %v after the failed unlock (PTTL %v, renewed by the watchdog of the request that gave up on it); last answer %d %s",
				3*watchdog, ttl, w.Code, w.Body.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
