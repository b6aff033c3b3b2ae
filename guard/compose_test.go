package guard_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// A composition docs/HTTP.md describes: a router-level Lock that combines, and a
// per-route Idempotent. A request whose batch did not commit (its COMMIT
// failed, or the lock was lost during a later request's turn) is answered
// 503 or 409, nothing of it is in the database, and its retry with the same
// key must run again: it used to be replayed the 201 its handler had
// written into the batch.
func TestCompose_AnUncommittedBatchIsNeverReplayed(t *testing.T) {
	srv := testenv.Redis(t)
	db := openOrdDB(t)
	lines := watchLines(t)
	session := &killCommit{Batches: gormplugin.Batch(db), admin: db}
	var gateOnce sync.Once
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Lock("unc:<sku>", guard.Combining(session), guard.Lease(300*time.Millisecond), guard.MaxBatchTime(time.Minute)))
		r.POST("/buy/:sku", g.Idempotent(guard.Unscoped()), func(c *gin.Context) {
			switch c.GetHeader("X-Do") {
			case "lead":
				gateOnce.Do(func() { close(started); <-gate })
			case "pause":
				time.Sleep(600 * time.Millisecond) // past the lease, not watching its context
			}
			tx, _ := gormplugin.Tx(c.Request.Context())
			o := ordOrder{Kase: c.GetHeader("Idempotency-Key"), SKU: c.Param("sku")}
			if err := tx.Create(&o).Error; err != nil {
				_ = c.Error(err)
				c.Status(http.StatusInternalServerError)
				return
			}
			c.JSON(http.StatusCreated, gin.H{"order": o.ID})
		})
	})
	orders := func(key string) int64 {
		var n int64
		if err := db.Model(&ordOrder{}).Where("kase = ?", key).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The batch's COMMIT fails.
	session.armed.Store(true)
	if r := do(t, "POST", in.srv.URL+"/buy/1", "", "Idempotency-Key", "commit-fails"); r.status != http.StatusServiceUnavailable || r.errorCode() != "batch_failed" {
		t.Fatalf("COMMIT failed: %d %s, want 503 batch_failed", r.status, r.body)
	}
	if n := orders("commit-fails"); n != 0 {
		t.Fatalf("%d orders after a failed COMMIT", n)
	}
	r := do(t, "POST", in.srv.URL+"/buy/1", "", "Idempotency-Key", "commit-fails")
	if r.status != http.StatusCreated || r.header.Get(guard.ReplayedHeader) != "" || orders("commit-fails") != 1 {
		t.Errorf("retry after a failed COMMIT: %d %s (replayed %q), %d orders; want it to run and buy once",
			r.status, r.body, r.header.Get(guard.ReplayedHeader), orders("commit-fails"))
	}

	// The lock is lost during a later request's turn in the batch.
	var first reply
	var wg sync.WaitGroup
	wg.Go(func() {
		first = do(t, "POST", in.srv.URL+"/buy/2", "", "Idempotency-Key", "lost-later", "X-Do", "lead")
	})
	<-started
	wg.Go(func() { do(t, "POST", in.srv.URL+"/buy/2", "", "Idempotency-Key", "the-pause", "X-Do", "pause") })
	lines.wait(t, "unc:2", 1)
	close(gate)
	wg.Wait()
	if first.status != http.StatusConflict || first.errorCode() != "lock_lost" || orders("lost-later") != 0 {
		t.Fatalf("lock lost in a later turn: %d %s, %d orders; want 409 lock_lost and none", first.status, first.body, orders("lost-later"))
	}
	r = do(t, "POST", in.srv.URL+"/buy/2", "", "Idempotency-Key", "lost-later")
	if r.status != http.StatusCreated || r.header.Get(guard.ReplayedHeader) != "" || orders("lost-later") != 1 {
		t.Errorf("retry after a batch that lost its lock: %d %s (replayed %q), %d orders; want it to run and buy once",
			r.status, r.body, r.header.Get(guard.ReplayedHeader), orders("lost-later"))
	}
}

// A router-level Lock and a per-route Idempotent: the handler reports a
// stale write the way Lock documents (c.Error, no answer of its own), the
// client is answered 409 stale_write, and the retry must run again: it used
// to be replayed an empty 200, the answer the inner Idempotent saw before
// the lock step turned it into 409.
func TestCompose_AStaleWriteUnderARouterLevelLockIsNotStored(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Lock("stale:<id>"))
		r.POST("/buy/:id", g.Idempotent(guard.Unscoped()), func(c *gin.Context) {
			if runs.Add(1) == 1 {
				_ = c.Error(fmt.Errorf("update items: %w", fencing.Stale("items", "id=1", 5, 9)))
				return
			}
			c.JSON(http.StatusCreated, gin.H{"run": runs.Load()})
		})
	})
	if r := do(t, "POST", in.srv.URL+"/buy/1", "", "Idempotency-Key", "k"); r.status != http.StatusConflict || r.errorCode() != "stale_write" {
		t.Fatalf("stale write: %d %s, want 409 stale_write", r.status, r.body)
	}
	r := do(t, "POST", in.srv.URL+"/buy/1", "", "Idempotency-Key", "k")
	if r.status != http.StatusCreated || r.header.Get(guard.ReplayedHeader) != "" || runs.Load() != 2 {
		t.Errorf("retry after a stale write: %d %q (replayed %q, runs %d); want the handler to run again",
			r.status, r.body, r.header.Get(guard.ReplayedHeader), runs.Load())
	}
}

// With StoreServerErrors a route keeps its handler's 5xx answers; the
// lock's own 500 lock_route_mismatch is the framework's answer, never the
// handler's, and must not be stored: it used to be replayed for the
// record's TTL.
func TestCompose_TheLocksOwnServerErrorIsNeverStored(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/orders", g.Idempotent(guard.Unscoped(), guard.StoreServerErrors()), g.Lock("order:<path:id>"), func(c *gin.Context) {
			runs.Add(1)
			c.Status(http.StatusCreated)
		})
	})
	for i := range 2 {
		r := do(t, "POST", in.srv.URL+"/orders", "", "Idempotency-Key", "k")
		if r.status != http.StatusInternalServerError || r.errorCode() != "lock_route_mismatch" || r.header.Get(guard.ReplayedHeader) != "" {
			t.Errorf("request %d: %d %s (replayed %q); want the lock's own 500, never replayed", i, r.status, r.body, r.header.Get(guard.ReplayedHeader))
		}
	}
	if recs := recordsIn(t, in); len(recs) != 0 {
		t.Errorf("records after the lock's own answers: %v", recs)
	}
}

// gormplugin.Tx with the *gin.Context, the Gin idiom, finds the batch's
// transaction on a combining route whatever the engine's
// ContextWithFallback: it used to find none, so that a handler so written
// ran its own transaction outside the batch.
func TestCombine_TxFindsTheBatchThroughTheGinContext(t *testing.T) {
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:id", g.Lock("ginctx:<id>", guard.Combining(gormplugin.Batch(openOrdDB(t)))), func(c *gin.Context) {
			viaGin, okGin := gormplugin.Tx(c)
			viaReq, okReq := gormplugin.Tx(c.Request.Context())
			c.JSON(http.StatusOK, gin.H{"gin": okGin, "request": okReq, "same": okGin && okReq && viaGin == viaReq})
		})
	})
	if r := do(t, "POST", in.srv.URL+"/buy/1", ""); r.status != http.StatusOK || string(r.body) != `{"gin":true,"request":true,"same":true}` {
		t.Errorf("gormplugin.Tx in a batch: %d %s; want the batch's transaction through the gin context too", r.status, r.body)
	}
}
