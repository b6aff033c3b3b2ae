package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// waitingLines follows the combining lines through the test hook: wait(key,
// n) returns once n requests wait in the line of key.
type waitingLines struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    map[string]int
}

func watchLines(t *testing.T) *waitingLines {
	w := &waitingLines{n: map[string]int{}}
	w.cond = sync.NewCond(&w.mu)
	guard.SetWaitingHook(func(key string, n int) {
		w.mu.Lock()
		w.n[key] = n
		w.mu.Unlock()
		w.cond.Broadcast()
	})
	t.Cleanup(func() { guard.SetWaitingHook(nil) })
	return w
}

func (w *waitingLines) wait(t *testing.T, key string, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		w.mu.Lock()
		for w.n[key] != n {
			w.cond.Wait()
		}
		w.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("line of %s: %d waiting, want %d", key, w.n[key], n)
	}
}

// countSession is a Session without a database: it counts what the
// Guard asks of it and tells each batch's handlers the batch's number.
type countSession struct {
	mu                    sync.Mutex
	begins, commits, ends int
	savepoints, undos     int
	nextBatch             int
	committed             []int // the numbers of the batches committed
}

type batchNo struct{}

func (s *countSession) Begin(ctx context.Context) (context.Context, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begins++
	s.nextBatch++
	return context.WithValue(ctx, batchNo{}, s.nextBatch), nil
}

func (s *countSession) Savepoint(context.Context, string) error {
	s.mu.Lock()
	s.savepoints++
	s.mu.Unlock()
	return nil
}

func (s *countSession) RollbackTo(context.Context, string) error {
	s.mu.Lock()
	s.undos++
	s.mu.Unlock()
	return nil
}

func (s *countSession) End(ctx context.Context, commit bool) error {
	s.mu.Lock()
	s.ends++
	if commit {
		s.commits++
		s.committed = append(s.committed, ctx.Value(batchNo{}).(int))
	}
	s.mu.Unlock()
	return nil
}

func (s *countSession) counts() (begins, commits, ends int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begins, s.commits, s.ends
}

// counter returns the sum of a counter's series of g.
func counter(t *testing.T, g *guard.Guard, name string) (sum float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// histogram returns the sample count and sum of a histogram series of g.
func histogram(t *testing.T, g *guard.Guard, name string) (count uint64, sum float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				count += m.GetHistogram().GetSampleCount()
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return count, sum
}

func TestCombine_LoneRequestRunsAtOnce(t *testing.T) {
	srv := testenv.Redis(t)
	s := &countSession{}
	var arrived atomic.Int64 // unix nanos of the request now in flight
	var delays = map[string][]time.Duration{}
	var mu sync.Mutex
	note := func(route string) gin.HandlerFunc {
		return func(c *gin.Context) {
			mu.Lock()
			delays[route] = append(delays[route], time.Since(time.Unix(0, arrived.Load())))
			mu.Unlock()
			c.Status(http.StatusNoContent)
		}
	}
	stamp := func(c *gin.Context) { arrived.Store(time.Now().UnixNano()) }
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/lock/:id", stamp, g.Lock("lone-lock:<id>"), note("lock"))
		r.POST("/combine/:id", stamp, g.Lock("lone-comb:<id>", guard.Combining(s)), note("combine"))
	})
	const n = 40
	for i := range n {
		// Interleaved, one request at a time: nobody to combine with.
		for _, route := range []string{"lock", "combine"} {
			if r := do(t, "POST", in.srv.URL+"/"+route+"/"+strconv.Itoa(i%4), ""); r.status != http.StatusNoContent {
				t.Fatalf("%s: %d %s", route, r.status, r.body)
			}
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	lockMed, combMed := med(delays["lock"]), med(delays["combine"])
	t.Logf("from arrival to the handler, median of %d: Lock %v, Combining %v", n, lockMed, combMed)
	// Same lock, same round trips; the combining step adds a map lookup and
	// no wait. 2ms of slack for a loaded machine.
	if combMed > lockMed+2*time.Millisecond {
		t.Errorf("a lone combining request waits %v before its handler, a Lock request %v: combining added waiting", combMed, lockMed)
	}
	if begins, commits, _ := s.counts(); begins != n || commits != n {
		t.Errorf("%d lone requests: %d batches begun, %d committed; want one each", n, begins, commits)
	}
	if count, sum := histogram(t, in.g, "seckillguard_batch_size"); count != n || sum != n {
		t.Errorf("batch_size: %d batches of %v requests in all; want %d batches of 1", count, sum, n)
	}
}

func TestCombine_BatchesAreBoundedBySizeAndTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []guard.RouteOption
		delay time.Duration // each handler's work
		most  int           // the largest batch allowed
	}{
		{name: "MaxBatch", opts: []guard.RouteOption{guard.MaxBatch(4)}, most: 4},
		// 20ms per request, 50ms per batch: at most 3 requests (the third
		// starts before 50ms are up).
		{name: "MaxBatchTime", opts: []guard.RouteOption{guard.MaxBatchTime(50 * time.Millisecond)}, delay: 20 * time.Millisecond, most: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.Redis(t)
			lines := watchLines(t)
			s := &countSession{}
			gate, started := make(chan struct{}), make(chan struct{})
			var first atomic.Bool
			var mu sync.Mutex
			perBatch := map[int]int{}
			in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
				r.POST("/buy/:id", g.Lock("bound:<id>", append(tc.opts, guard.Combining(s))...), func(c *gin.Context) {
					if first.CompareAndSwap(false, true) {
						close(started)
						<-gate // the others line up behind the first
					}
					time.Sleep(tc.delay)
					mu.Lock()
					perBatch[c.Request.Context().Value(batchNo{}).(int)]++
					mu.Unlock()
					c.Status(http.StatusCreated)
				})
			})
			const n = 12
			var wg sync.WaitGroup
			statuses := make([]int, n)
			wg.Go(func() { statuses[0] = do(t, "POST", in.srv.URL+"/buy/1", "").status })
			<-started
			for i := 1; i < n; i++ {
				wg.Go(func() { statuses[i] = do(t, "POST", in.srv.URL+"/buy/1", "").status })
			}
			lines.wait(t, "bound:1", n-1)
			close(gate)
			wg.Wait()
			for i, st := range statuses {
				if st != http.StatusCreated {
					t.Errorf("request %d: %d, want 201", i, st)
				}
			}
			total := 0
			for b, k := range perBatch {
				total += k
				if k > tc.most {
					t.Errorf("batch %d ran %d requests; the bound allows %d", b, k, tc.most)
				}
			}
			if total != n || len(perBatch) < 2 {
				t.Errorf("%d requests in %d batches %v; want %d in several", total, len(perBatch), perBatch, n)
			}
			if _, combined := histogram(t, in.g, "seckillguard_batch_size"); combined != n {
				t.Errorf("batch_size sums to %v, want %d", combined, n)
			}
		})
	}
}

// The tables of the transactional tests.
type combItem struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

type combOrder struct {
	ID      uint
	User    string  `gorm:"size:64;uniqueIndex:idx_comb_user_sku"`
	SKU     string  `gorm:"size:64;uniqueIndex:idx_comb_user_sku"`
	IdemKey *string `gorm:"size:64;uniqueIndex"`
	Fence   gormplugin.Fence
}

func openCombDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(mysql.Open(testenv.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&combItem{}, &combOrder{}); err != nil {
		t.Fatal(err)
	}
	return db
}

// combBuy is the purchase of the transactional tests, written for one
// request: lock the row, check the stock, deduct, create the order. In a
// batch it runs in the batch's transaction, after a savepoint.
func combBuy(tokens *sync.Map) gin.HandlerFunc {
	return func(c *gin.Context) {
		ctx := c.Request.Context()
		tx, ok := gormplugin.Tx(ctx)
		if !ok {
			c.String(http.StatusInternalServerError, "not in a batch")
			return
		}
		if tok, ok := guard.Token(c); ok && tokens != nil {
			tokens.Store(tok, true)
		}
		sku, user := c.Param("sku"), c.GetHeader("X-User")
		if f, ok := c.Get("before"); ok {
			f.(func(*gin.Context))(c)
		}
		var it combItem
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("sku = ?", sku).Take(&it).Error; err != nil {
			_ = c.Error(err)
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		if it.Stock <= 0 {
			c.JSON(http.StatusConflict, gin.H{"error": "sold_out"})
			return
		}
		if err := tx.Model(&combItem{}).Where("sku = ?", sku).Update("stock", it.Stock-1).Error; err != nil {
			_ = c.Error(err)
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		o := combOrder{User: user, SKU: sku}
		if k, ok := guard.IdempotencyRecord(c); ok {
			o.IdemKey = &k
		}
		if err := tx.Create(&o).Error; err != nil {
			if errors.Is(err, gormplugin.ErrDuplicate) {
				c.JSON(http.StatusConflict, gin.H{"error": "already_purchased"})
				return
			}
			_ = c.Error(err)
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.JSON(http.StatusCreated, gin.H{"order": o.ID, "user": user})
	}
}

func TestCombine_BatchMixingNewBuyersRepeatBuyersAndCancelledRequests(t *testing.T) {
	srv := testenv.Redis(t)
	db := openCombDB(t)
	lines := watchLines(t)
	const stock = 10
	if err := db.Exec("INSERT INTO comb_items (sku, stock, fence) VALUES ('mix', ?, 0)", stock).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO comb_orders (user, sku, fence) VALUES ('repeat', 'mix', 0)").Error; err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	var tokens sync.Map
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", func(c *gin.Context) {
			if c.GetHeader("X-User") == "leader" {
				c.Set("before", func(*gin.Context) { close(started); <-gate })
			}
		}, g.Lock("mix:<sku>", guard.Combining(gormplugin.Batch(db)), guard.MaxBatchTime(time.Minute)), combBuy(&tokens))
	})
	url := in.srv.URL + "/buy/mix"
	var wg sync.WaitGroup
	answers := map[string][]reply{}
	var mu sync.Mutex
	send := func(user string) {
		wg.Go(func() {
			r := do(t, "POST", url, "", "X-User", user)
			mu.Lock()
			answers[user] = append(answers[user], r)
			mu.Unlock()
		})
	}
	send("leader")
	<-started
	// The followers: new buyers, a buyer who bought before, and a buyer
	// who clicks twice (both requests in this batch).
	users := []string{"new-1", "repeat", "new-2", "twice", "twice", "new-3"}
	for i, u := range users {
		send(u)
		lines.wait(t, "mix:mix", i+1)
	}
	// One more that gives up while it waits in line.
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", url, nil)
		req.Header.Set("X-User", "gone")
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	lines.wait(t, "mix:mix", len(users)+1)
	cancel()
	lines.wait(t, "mix:mix", len(users)) // it left the line
	<-gone
	close(gate)
	wg.Wait()

	want := map[string][]string{
		"leader": {"201"}, "new-1": {"201"}, "new-2": {"201"}, "new-3": {"201"},
		"repeat": {"409 already_purchased"}, "twice": {"201", "409 already_purchased"},
	}
	for u, ws := range want {
		var got []string
		for _, r := range answers[u] {
			s := strconv.Itoa(r.status)
			if code := r.errorCode(); code != "" {
				s += " " + code
			}
			got = append(got, s)
		}
		slices.Sort(got)
		if !slices.Equal(got, ws) {
			t.Errorf("%s was answered %v, want %v", u, got, ws)
		}
	}
	var it combItem
	var orders []combOrder
	if err := db.Where("sku = 'mix'").Take(&it).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Where("sku = 'mix'").Find(&orders).Error; err != nil {
		t.Fatal(err)
	}
	sold := len(orders) - 1 // the repeat buyer's order was there before
	if sold != 5 || it.Stock != stock-sold {
		t.Errorf("after the batch: %d new orders, stock %d of %d; want 5 new orders and stock %d", sold, it.Stock, stock, stock-5)
	}
	for _, o := range orders {
		if o.User == "gone" {
			t.Errorf("the request that left the line bought: %+v", o)
		}
	}
	// One batch, one hold: one token fenced every write.
	var toks []fencing.Token
	tokens.Range(func(k, _ any) bool { toks = append(toks, k.(fencing.Token)); return true })
	if len(toks) != 1 || it.Fence.Token() != toks[0] {
		t.Errorf("tokens seen by the handlers %v, row fence %d: want one token, on the row", toks, it.Fence.Token())
	}
	if count, sum := histogram(t, in.g, "seckillguard_batch_size"); count != 1 || sum != 7 {
		t.Errorf("batch_size: %d batches, %v requests; want 1 batch of 7 (the leader and six followers)", count, sum)
	}
}

func TestCombine_LostLeaseMidBatchRefusesEveryWriteOfTheBatch(t *testing.T) {
	srv := testenv.Redis(t)
	db := openCombDB(t)
	lines := watchLines(t)
	if err := db.Exec("INSERT INTO comb_items (sku, stock, fence) VALUES ('lost', 10, 0)").Error; err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", func(c *gin.Context) {
			switch c.GetHeader("X-User") {
			case "leader":
				c.Set("before", func(*gin.Context) { close(started); <-gate })
			case "paused":
				// A pause longer than the lease, as a GC pause would be:
				// it does not watch its context.
				c.Set("before", func(*gin.Context) { time.Sleep(700 * time.Millisecond) })
			}
		}, g.Lock("lost:<sku>", guard.Lease(400*time.Millisecond), guard.Combining(gormplugin.Batch(db)), guard.MaxBatchTime(time.Minute)), combBuy(nil))
	})
	url := in.srv.URL + "/buy/lost"
	var wg sync.WaitGroup
	answers := make(map[string]reply)
	var mu sync.Mutex
	send := func(user string) {
		wg.Go(func() {
			r := do(t, "POST", url, "", "X-User", user)
			mu.Lock()
			answers[user] = r
			mu.Unlock()
		})
	}
	send("leader")
	users := []string{"a", "b", "paused", "c"}
	<-started
	for i, u := range users {
		send(u)
		lines.wait(t, "lost:lost", i+1)
	}
	close(gate)
	wg.Wait()
	// The batch is the leader and the requests it took before the pause;
	// c, still in line when the batch failed, runs in the next one under a
	// hold of its own.
	for u, r := range answers {
		if u == "c" {
			if r.status != http.StatusCreated {
				t.Errorf("c, in the next batch: %d %s; want 201", r.status, r.body)
			}
			continue
		}
		if r.status != http.StatusConflict || (r.errorCode() != "lock_lost" && r.errorCode() != "stale_write") {
			t.Errorf("%s: %d %s; want 409 lock_lost (or stale_write)", u, r.status, r.body)
		}
	}
	var it combItem
	var n int64
	if err := db.Where("sku = 'lost'").Take(&it).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&combOrder{}).Where("sku = 'lost'").Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 1 || it.Stock != 9 {
		t.Errorf("after a batch that lost its lock and one that did not: %d orders, stock %d; want only the second's (1 order, stock 9)", n, it.Stock)
	}
}

func TestCombine_LostLockEndsTheBatchUncommitted(t *testing.T) {
	// Without a database: the Guard itself must stop a batch whose lock is
	// lost and never ask the Session to commit it.
	srv := testenv.Redis(t)
	lines := watchLines(t)
	s := &countSession{}
	gate, started := make(chan struct{}), make(chan struct{})
	var committed sync.Map // users whose OnCommit ran
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/w/:id", g.Lock("uncommitted:<id>", guard.Lease(200*time.Millisecond), guard.Combining(s), guard.MaxBatchTime(time.Minute)), func(c *gin.Context) {
			u := c.GetHeader("X-User")
			switch u {
			case "leader":
				close(started)
				<-gate
			case "paused":
				time.Sleep(400 * time.Millisecond)
			}
			guard.OnCommit(c, func() { committed.Store(u, true) })
			c.Status(http.StatusCreated)
		})
	})
	var wg sync.WaitGroup
	var statuses sync.Map
	send := func(user string) {
		wg.Go(func() { statuses.Store(user, do(t, "POST", in.srv.URL+"/w/1", "", "X-User", user)) })
	}
	send("leader")
	<-started
	for i, u := range []string{"a", "paused", "b"} {
		send(u)
		lines.wait(t, "uncommitted:1", i+1)
	}
	close(gate)
	wg.Wait()
	statuses.Range(func(u, r any) bool {
		rr := r.(reply)
		if u == "b" { // still in line when the batch failed: the next batch's
			if rr.status != http.StatusCreated {
				t.Errorf("b: %d %s; want 201 from the next batch", rr.status, rr.body)
			}
			return true
		}
		if rr.status != http.StatusConflict || rr.errorCode() != "lock_lost" {
			t.Errorf("%s: %d %s; want 409 lock_lost", u, rr.status, rr.body)
		}
		return true
	})
	var ran []string
	committed.Range(func(u, _ any) bool { ran = append(ran, u.(string)); return true })
	if !slices.Equal(ran, []string{"b"}) {
		t.Errorf("OnCommit ran for %v; want only b, whose batch committed", ran)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.committed, 1) {
		t.Errorf("the batch that lost its lock was committed (committed batches %v)", s.committed)
	}
}

func TestCombine_EachRequestKeepsItsOwnIdempotencyRecord(t *testing.T) {
	srv := testenv.Redis(t)
	db := openCombDB(t)
	lines := watchLines(t)
	if err := db.Exec("INSERT INTO comb_items (sku, stock, fence) VALUES ('idem', 10, 0)").Error; err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku",
			func(c *gin.Context) {
				if c.GetHeader("X-User") == "u0" {
					c.Set("before", func(*gin.Context) { close(started); <-gate })
				}
			},
			g.Idempotent(guard.Scope("<header:X-User>")),
			g.Lock("idem:<sku>", guard.Combining(gormplugin.Batch(db)), guard.MaxBatchTime(time.Minute)), combBuy(nil))
	})
	url := in.srv.URL + "/buy/idem"
	const n = 4
	first := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		u := "u" + strconv.Itoa(i)
		wg.Go(func() { first[i] = do(t, "POST", url, "", "X-User", u, "Idempotency-Key", "k-"+u) })
		if i == 0 {
			<-started
		} else {
			lines.wait(t, "idem:idem", i)
		}
	}
	close(gate)
	wg.Wait()
	if count, sum := histogram(t, in.g, "seckillguard_batch_size"); count != 1 || sum != n {
		t.Fatalf("batch_size: %d batches, %v requests; want one batch of %d", count, sum, n)
	}
	for i := range n {
		u := "u" + strconv.Itoa(i)
		again := do(t, "POST", url, "", "X-User", u, "Idempotency-Key", "k-"+u)
		if first[i].status != http.StatusCreated || again.status != http.StatusCreated ||
			again.header.Get(guard.ReplayedHeader) != "true" || string(again.body) != string(first[i].body) {
			t.Errorf("%s: first %d %s, repeat %d %s (replayed %q); want its own 201 replayed",
				u, first[i].status, first[i].body, again.status, again.body, again.header.Get(guard.ReplayedHeader))
		}
	}
	var orders int64
	if err := db.Model(&combOrder{}).Where("sku = 'idem'").Count(&orders).Error; err != nil {
		t.Fatal(err)
	}
	if orders != n {
		t.Errorf("%d orders, want %d", orders, n)
	}
}

// Inside a batch's turn nobody waits for the first request with its key
// (WaitForFirst): the first's record is settled only once its batch is
// over, and the batch waits for this turn. A duplicate taken into the
// first's batch is answered 409 request_in_progress at once; waiting, it
// would hold the batch, and the lock, for the whole WaitForFirst.
func TestCombine_ADuplicateInTheFirstsBatchDoesNotWaitForIt(t *testing.T) {
	srv := testenv.Redis(t)
	db := openCombDB(t)
	lines := watchLines(t)
	if err := db.Exec("INSERT INTO comb_items (sku, stock, fence) VALUES ('wff', 10, 0)").Error; err != nil {
		t.Fatal(err)
	}
	const waitForFirst = 10 * time.Second
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku",
			func(c *gin.Context) {
				if c.GetHeader("X-First") != "" {
					c.Set("before", func(*gin.Context) { close(started); <-gate })
				}
			},
			g.Lock("wff:<sku>", guard.Combining(gormplugin.Batch(db)), guard.MaxBatchTime(time.Minute)),
			g.Idempotent(guard.Scope("<header:X-User>"), guard.WaitForFirst(waitForFirst)), combBuy(nil))
	})
	url := in.srv.URL + "/buy/wff"
	var first, dup reply
	var dupTook time.Duration
	var wg sync.WaitGroup
	wg.Go(func() { first = do(t, "POST", url, "", "X-User", "u", "Idempotency-Key", "k", "X-First", "1") })
	<-started
	wg.Go(func() {
		start := time.Now()
		dup = do(t, "POST", url, "", "X-User", "u", "Idempotency-Key", "k")
		dupTook = time.Since(start)
	})
	lines.wait(t, "wff:wff", 1)
	close(gate)
	wg.Wait()
	if first.status != http.StatusCreated || dup.status != http.StatusConflict || dup.errorCode() != "request_in_progress" {
		t.Errorf("first %d %s, duplicate %d %s; want 201 and 409 request_in_progress", first.status, first.body, dup.status, dup.body)
	}
	if dupTook > waitForFirst/2 {
		t.Errorf("the duplicate was answered after %v: it waited for the first request, whose batch waited for it", dupTook)
	}
	if count, sum := histogram(t, in.g, "seckillguard_batch_size"); count != 1 || sum != 2 {
		t.Errorf("batch_size: %d batches, %v requests; want one batch of both", count, sum)
	}
}

// A request that waits in a combining line and whose client is gone is
// answered as a request whose client went away, never busy, also when its
// wait ran out at the same time: a cancelled caller is never reported as
// busy (nor counted in lock_busy_total).
func TestCombine_ACancelledRequestInLineIsNeverBusy(t *testing.T) {
	srv := testenv.Redis(t)
	lines := watchLines(t)
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		// Wait(0): a request in line has waited all it may as soon as it
		// is there.
		r.POST("/buy/:sku", g.Lock("gone:<sku>", guard.Combining(&countSession{}), guard.Wait(0)), func(c *gin.Context) {
			if c.GetHeader("X-First") != "" {
				close(started)
				<-gate
			}
			c.Status(http.StatusCreated)
		})
	})
	var wg sync.WaitGroup
	wg.Go(func() { do(t, "POST", in.srv.URL+"/buy/1", "", "X-First", "1") })
	<-started
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	answers := map[int]int{}
	for range 40 {
		req := httptest.NewRequestWithContext(gone, http.MethodPost, "/buy/1", nil)
		rec := newRecorder()
		in.r.ServeHTTP(rec, req)
		answers[rec.Code]++
	}
	lines.wait(t, "gone:1", 0)
	close(gate)
	wg.Wait()
	if answers[guard.StatusClientClosedRequest] != 40 {
		t.Errorf("requests whose client was gone, waiting in line: answered %v; want 499 for all 40", answers)
	}
	if n := counter(t, in.g, "seckillguard_lock_busy_total"); n != 0 {
		t.Errorf("lock_busy_total %v; want 0: no caller was busy", n)
	}
}

func TestCombine_OptionsOutOfPlaceAreRefusedAtRegistration(t *testing.T) {
	g := guard.New(testenv.Redis(t).Client(), guard.WithLogger(quiet))
	defer g.Close()
	for name, register := range map[string]func(){
		"MaxBatch without Combining":     func() { g.Lock("k:<id>", guard.MaxBatch(4)) },
		"MaxBatchTime without Combining": func() { g.Lock("k:<id>", guard.MaxBatchTime(time.Second)) },
		"Combining given to Idempotent":  func() { g.Idempotent(guard.Unscoped(), guard.Combining(&countSession{})) },
		"Combining(nil)":                 func() { g.Lock("k:<id>", guard.Combining(nil)) },
		"MaxBatch(0)":                    func() { g.Lock("k:<id>", guard.Combining(&countSession{}), guard.MaxBatch(0)) },
	} {
		func() {
			defer func() {
				err, _ := recover().(error)
				if !errors.Is(err, guard.ErrBadOption) {
					t.Errorf("%s: registration panicked with %v; want ErrBadOption", name, err)
				}
			}()
			register()
		}()
	}
}

func TestPolicies_WithGivesOneRouteWhatTheFileCannotSay(t *testing.T) {
	pol, err := guard.ParsePolicies("test.yaml", []byte(`
routes:
  - route: POST /buy/:sku
    lock: "with:<sku>"
  - route: POST /pay
    idempotency:
      unscoped: true
`))
	if err != nil {
		t.Fatal(err)
	}
	s := &countSession{}
	for route, want := range map[string]string{
		"POST /nope":    "no such route",
		"POST /pay":     "takes no lock",
		"POST/buy/:sku": "want",
	} {
		if _, err := pol.With(route, guard.Combining(s)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("With(%q): %v; want an error saying %q", route, err, want)
		}
	}
	with, err := pol.With("POST /buy/:sku", guard.Combining(s))
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, testenv.Redis(t), func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Policies(with))
		r.POST("/buy/:sku", func(c *gin.Context) {
			_, inBatch := c.Request.Context().Value(batchNo{}).(int)
			c.JSON(http.StatusOK, gin.H{"batch": inBatch, "key": guard.Key(c)})
		})
	})
	if r := do(t, "POST", in.srv.URL+"/buy/7", ""); r.status != http.StatusOK || string(r.body) != `{"batch":true,"key":"with:7"}` {
		t.Errorf("a route combining through With: %d %s", r.status, r.body)
	}
}

func TestStepHook_ACombiningRouteReportsOneLockPerBatchAndEveryTurn(t *testing.T) {
	srv := testenv.Redis(t)
	lines := watchLines(t)
	var log stepLog
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Lock("steps:<sku>", guard.Combining(&countSession{}), guard.MaxBatchTime(time.Minute)), func(c *gin.Context) {
			if c.GetHeader("X-User") == "leader" {
				close(started)
				<-gate
			}
			step, _ := c.Request.Context().Value(stepKey{}).(string)
			c.String(http.StatusCreated, step)
		})
	}, guard.WithStepHook(log.hook))
	var wg sync.WaitGroup
	var bodies sync.Map
	send := func(u string) {
		wg.Go(func() { bodies.Store(u, string(do(t, "POST", in.srv.URL+"/buy/1", "", "X-User", u).body)) })
	}
	send("leader")
	<-started
	send("follower")
	lines.wait(t, "steps:1", 1)
	close(gate)
	wg.Wait()
	got, _ := log.take()
	sameLines(t, "a batch of two", got,
		`start lock POST /buy/:sku key="steps:1"`, "end lock acquired",
		`start handler POST /buy/:sku key=""`, "end handler ok",
		`start handler POST /buy/:sku key=""`, "end handler ok")
	bodies.Range(func(u, b any) bool {
		if b != "handler" {
			t.Errorf("%s: the handler's context is %q, want StepHandler's", u, b)
		}
		return true
	})
}

func TestMetrics_ACombiningRouteHasItsBatchSeriesAtZeroFromLoading(t *testing.T) {
	pol, err := guard.ParsePolicies("test.yaml", []byte("routes:\n  - route: POST /buy/:sku\n    lock: \"zero:<sku>\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	with, err := pol.With("POST /buy/:sku", guard.Combining(&countSession{}))
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(testenv.Redis(t).Client(), guard.WithLogger(quiet))
	defer g.Close()
	g.Policies(with)
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, f := range fams {
		switch f.GetName() {
		case "seckillguard_batch_size", "seckillguard_combined_requests_total":
			for _, m := range f.GetMetric() {
				found[f.GetName()] = fmt.Sprintf("%s %s count=%d value=%v", label(m, "method"), label(m, "route"),
					m.GetHistogram().GetSampleCount(), m.GetCounter().GetValue())
			}
		}
	}
	want := map[string]string{
		"seckillguard_batch_size":              "POST /buy/:sku count=0 value=0",
		"seckillguard_combined_requests_total": "POST /buy/:sku count=0 value=0",
	}
	for name, w := range want {
		if found[name] != w {
			t.Errorf("%s after loading: %q, want %q (labelled by route template, at zero)", name, found[name], w)
		}
	}
}

func TestCombine_APanickingHandlerFailsOnlyItsOwnRequest(t *testing.T) {
	for _, who := range []string{"leader", "follower-1"} {
		t.Run(who+" panics", func(t *testing.T) {
			srv := testenv.Redis(t)
			lines := watchLines(t)
			s := &countSession{}
			gate, started := make(chan struct{}), make(chan struct{})
			key := "panic-" + who
			in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
				r.POST("/buy/:id", g.Lock(key+":<id>", guard.Combining(s), guard.MaxBatchTime(time.Minute)), func(c *gin.Context) {
					u := c.GetHeader("X-User")
					if u == "leader" {
						close(started)
						<-gate
					}
					if u == who {
						panic("handler bug")
					}
					c.Status(http.StatusCreated)
				})
			})
			var wg sync.WaitGroup
			var statuses sync.Map
			send := func(u string) {
				wg.Go(func() { statuses.Store(u, do(t, "POST", in.srv.URL+"/buy/1", "", "X-User", u).status) })
			}
			send("leader")
			<-started
			for i, u := range []string{"follower-1", "follower-2"} {
				send(u)
				lines.wait(t, key+":1", i+1)
			}
			close(gate)
			wg.Wait()
			statuses.Range(func(u, st any) bool {
				want := http.StatusCreated
				if u == who {
					want = http.StatusInternalServerError
				}
				if st != want {
					t.Errorf("%s: %v, want %d", u, st, want)
				}
				return true
			})
			if begins, commits, _ := s.counts(); commits != 1 {
				t.Errorf("%d batches begun, %d committed; want the batch committed once for the two that did not panic", begins, commits)
			}
			if holds, _ := histogram(t, in.g, "seckillguard_lock_hold_seconds"); holds != 1 {
				t.Errorf("%d holds ended for one batch; want one, released once", holds)
			}
		})
	}
}

func TestCombine_FailOpenRunsARequestAloneInItsSessionWithoutTheLock(t *testing.T) {
	srv := testenv.Redis(t)
	s := &countSession{}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:id", g.Lock("open:<id>", guard.Combining(s), guard.FailOpen()), func(c *gin.Context) {
			_, inBatch := c.Request.Context().Value(batchNo{}).(int)
			_, fenced := guard.Token(c)
			c.JSON(http.StatusCreated, gin.H{"batch": inBatch, "key": guard.Key(c), "fenced": fenced})
		})
	})
	srv.Kill()
	r := do(t, "POST", in.srv.URL+"/buy/1", "")
	if r.status != http.StatusCreated || string(r.body) != `{"batch":true,"fenced":false,"key":""}` {
		t.Errorf("Redis down, FailOpen: %d %s; want 201 from a handler in a Session of its own, unlocked and unfenced", r.status, r.body)
	}
	if _, commits, _ := s.counts(); commits != 1 {
		t.Errorf("%d commits, want the request's own", commits)
	}
}

// The first request of a batch fails (a 4xx) after writing: with nothing
// kept before it, its part is undone by ending the work uncommitted, not by
// a savepoint, and the next request's part begins afresh; the batch's commit
// keeps only the next request's order.
func TestCombine_AFailedFirstPartIsUndone(t *testing.T) {
	srv := testenv.Redis(t)
	db := openCombDB(t)
	lines := watchLines(t)
	gate, started := make(chan struct{}), make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Lock("undo:<sku>", guard.Combining(gormplugin.Batch(db)), guard.MaxBatchTime(time.Minute)), func(c *gin.Context) {
			tx, _ := gormplugin.Tx(c)
			user := c.GetHeader("X-User")
			if err := tx.Create(&combOrder{User: user, SKU: c.Param("sku")}).Error; err != nil {
				guard.AbortStale(c, err)
				return
			}
			if user == "leader" {
				close(started)
				<-gate
				c.JSON(http.StatusConflict, gin.H{"error": "changed_mind"}) // after its write
				return
			}
			c.JSON(http.StatusCreated, gin.H{"user": user})
		})
	})
	var wg sync.WaitGroup
	answers := map[string]int{}
	var mu sync.Mutex
	send := func(user string) {
		wg.Go(func() {
			r := do(t, "POST", in.srv.URL+"/buy/undo", "", "X-User", user)
			mu.Lock()
			answers[user] = r.status
			mu.Unlock()
		})
	}
	send("leader")
	<-started
	send("follower")
	lines.wait(t, "undo:undo", 1)
	close(gate)
	wg.Wait()
	if answers["leader"] != http.StatusConflict || answers["follower"] != http.StatusCreated {
		t.Fatalf("answers %v, want the leader's 409 and the follower's 201", answers)
	}
	if count, sum := histogram(t, in.g, "seckillguard_batch_size"); count != 1 || sum != 2 {
		t.Fatalf("batch_size: %d batches, %v requests; want one batch of both", count, sum)
	}
	var users []string
	if err := db.Model(&combOrder{}).Where("sku = 'undo'").Pluck("user", &users).Error; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(users, []string{"follower"}) {
		t.Errorf("orders of %v after the batch; want only the follower's: the failed first part must be undone", users)
	}
}
