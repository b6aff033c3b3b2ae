package guard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// The tables of the order tests.
type ordItem struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

type ordOrder struct {
	ID    uint
	Kase  string `gorm:"size:128;index"`
	SKU   string `gorm:"size:64"`
	Fence gormplugin.Fence
}

func openOrdDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(mysql.Open(testenv.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&ordItem{}, &ordOrder{}); err != nil {
		t.Fatal(err)
	}
	return db
}

// killCommit is gormplugin.Batch whose next COMMIT fails once armed: the
// batch's connection is killed from another connection just before it, so
// the COMMIT fails and MariaDB rolls the batch's work back.
type killCommit struct {
	*gormplugin.Batches
	admin *gorm.DB
	armed atomic.Bool
}

func (k *killCommit) End(ctx context.Context, commit bool) error {
	if commit && k.armed.CompareAndSwap(true, false) {
		tx, _ := gormplugin.Tx(ctx)
		var id int64
		if err := tx.Raw("SELECT CONNECTION_ID()").Scan(&id).Error; err != nil {
			return err
		}
		if err := k.admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)).Error; err != nil {
			return err
		}
	}
	return k.Batches.End(ctx, commit)
}

// An arrangement is one way of composing Lock and Idempotent for the route
// POST /buy/:sku.
type arrangement struct {
	name string
	// idemOutside: the idempotency step meets a request before the lock.
	idemOutside bool
	register    func(t *testing.T, g *guard.Guard, r *gin.Engine, lockOpts, idemOpts []guard.RouteOption, h gin.HandlerFunc)
}

const ordTemplate = "ord:<sku>"

var arrangements = []arrangement{
	{name: "Use(Lock) + route Idempotent", register: func(_ *testing.T, g *guard.Guard, r *gin.Engine, lo, io []guard.RouteOption, h gin.HandlerFunc) {
		r.Use(g.Lock(ordTemplate, lo...))
		r.POST("/buy/:sku", g.Idempotent(io...), h)
	}},
	{name: "Use(Idempotent) + route Lock", idemOutside: true, register: func(_ *testing.T, g *guard.Guard, r *gin.Engine, lo, io []guard.RouteOption, h gin.HandlerFunc) {
		r.Use(g.Idempotent(io...))
		r.POST("/buy/:sku", g.Lock(ordTemplate, lo...), h)
	}},
	{name: "route Lock, Idempotent", register: func(_ *testing.T, g *guard.Guard, r *gin.Engine, lo, io []guard.RouteOption, h gin.HandlerFunc) {
		r.POST("/buy/:sku", g.Lock(ordTemplate, lo...), g.Idempotent(io...), h)
	}},
	{name: "route Idempotent, Lock", idemOutside: true, register: func(_ *testing.T, g *guard.Guard, r *gin.Engine, lo, io []guard.RouteOption, h gin.HandlerFunc) {
		r.POST("/buy/:sku", g.Idempotent(io...), g.Lock(ordTemplate, lo...), h)
	}},
	{name: "Policies", idemOutside: true, register: func(t *testing.T, g *guard.Guard, r *gin.Engine, lo, io []guard.RouteOption, h gin.HandlerFunc) {
		pol, err := guard.ParsePolicies("order.yaml", []byte("routes:\n  - route: POST /buy/:sku\n    lock: \""+ordTemplate+"\"\n    idempotency:\n      unscoped: true\n"))
		if err != nil {
			t.Fatal(err)
		}
		if pol, err = pol.With("POST /buy/:sku", append(append([]guard.RouteOption(nil), lo...), io...)...); err != nil {
			t.Fatal(err)
		}
		r.Use(g.Policies(pol))
		r.POST("/buy/:sku", h)
	}},
}

// An ordering case is what the first request with a key runs into.
type ordCase struct {
	name      string
	combining bool // only on a combining route
	// answer is what the first request is answered: "201", or the status
	// and the error code; "gone" for a client that went away.
	answer string
	// replayed says that the retry with the same key is replayed the
	// first answer; otherwise it runs the handler again.
	replayed bool
}

var ordCases = []ordCase{
	{name: "created", answer: "201", replayed: true},
	{name: "handler 4xx", answer: "409 sold_out"},
	{name: "handler 5xx", answer: "503 downstream"},
	{name: "panic", answer: "500"},
	{name: "stale write reported", answer: "409 stale_write"},
	{name: "lock lost", answer: "409 lock_lost"},
	{name: "lost in a later member's turn", combining: true, answer: "409 lock_lost"},
	{name: "batch COMMIT fails", combining: true, answer: "503 batch_failed"},
	{name: "client gone", answer: "gone"},
}

// ordRig is one arrangement's instance and what the handler needs.
type ordRig struct {
	t         *testing.T
	in        *instance
	db        *gorm.DB
	session   *killCommit
	combining bool
	prefix    string // of this rig's SKUs
	lines     *waitingLines

	mu      sync.Mutex
	firsts  map[string]bool          // the cases whose first request has run
	runs    map[string]int           // handler runs per case
	gates   map[string]chan struct{} // a case's first request waits here
	entered map[string]chan struct{} // closed when it does
	done    map[string]chan struct{} // closed when the server finished a request (X-Req)
	locks   map[string]int           // StepLock starts per lock key
}

const ordLease = 400 * time.Millisecond

func newOrdRig(t *testing.T, srv *testenv.RedisServer, db *gorm.DB, lines *waitingLines, a arrangement, combining bool, prefix string) *ordRig {
	rig := &ordRig{t: t, db: db, combining: combining, prefix: prefix, lines: lines,
		firsts: map[string]bool{}, runs: map[string]int{}, gates: map[string]chan struct{}{},
		entered: map[string]chan struct{}{}, done: map[string]chan struct{}{}, locks: map[string]int{}}
	lockOpts := []guard.RouteOption{guard.Lease(ordLease), guard.Wait(5 * time.Second)}
	if combining {
		rig.session = &killCommit{Batches: gormplugin.Batch(db), admin: db}
		lockOpts = append(lockOpts, guard.Combining(rig.session), guard.MaxBatchTime(time.Minute))
	}
	idemOpts := []guard.RouteOption{guard.Unscoped()}
	hook := func(ctx context.Context, s guard.StepInfo) (context.Context, func(guard.StepResult)) {
		if s.Step == guard.StepLock {
			rig.mu.Lock()
			rig.locks[s.Key]++
			rig.mu.Unlock()
		}
		return ctx, nil
	}
	rig.in = newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(rig.track)
		a.register(t, g, r, lockOpts, idemOpts, rig.handle)
	}, guard.WithStepHook(hook))
	return rig
}

// track tells the test when the server has finished a request.
func (rig *ordRig) track(c *gin.Context) {
	defer func() {
		if id := c.GetHeader("X-Req"); id != "" {
			rig.mu.Lock()
			ch := rig.done[id]
			rig.mu.Unlock()
			if ch != nil {
				close(ch)
			}
		}
	}()
	c.Next()
}

// handle is the route's handler: a purchase written for one request that
// deducts a unit fenced with the lock's token and creates an order. The
// first request of a case does what the case says; the others buy.
func (rig *ordRig) handle(c *gin.Context) {
	kase := c.GetHeader("X-Case")
	rig.mu.Lock()
	first := !rig.firsts[kase]
	rig.firsts[kase] = true
	rig.runs[kase]++
	gate, entered := rig.gates[kase], rig.entered[kase]
	rig.mu.Unlock()
	if entered != nil && first {
		close(entered)
	}
	if gate != nil && first {
		<-gate
	}
	behaviour := "buy"
	if first {
		behaviour = c.GetHeader("X-First")
	}
	tx, ok := gormplugin.Tx(c) // the Gin idiom: the batch's transaction on a combining route
	if rig.combining != ok {
		c.String(http.StatusInternalServerError, "in a batch: %v", ok)
		return
	}
	if !ok {
		// Fenced by the lock's token. (Not db.WithContext(c): database/sql
		// watches that context from a goroutine of its own, and
		// gin.Context.Done reads c.Request, which the guard's steps set
		// back after the handler; the race detector sees the two.)
		tx = rig.db.WithContext(c.Request.Context())
	}
	sku := c.Param("sku")
	switch behaviour {
	case "sold out":
		c.JSON(http.StatusConflict, gin.H{"error": "sold_out"})
		return
	case "downstream":
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": "downstream"})
		return
	case "panic":
		panic("handler bug")
	case "lost":
		<-c.Request.Context().Done() // the lease runs out under it; it writes nothing
		return
	case "pause":
		time.Sleep(ordLease + 300*time.Millisecond) // a pause that does not watch its context
	case "newer holder":
		// A newer holder wrote the row meanwhile: its fence is above this
		// request's token.
		if err := rig.db.Exec("UPDATE ord_items SET fence = ? WHERE sku = ?", int64(math.MaxInt64/2), sku).Error; err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
	}
	res := tx.Model(&ordItem{}).Where("sku = ?", sku).Update("stock", gorm.Expr("stock - 1"))
	if res.Error != nil {
		guard.AbortStale(c, res.Error)
		return
	}
	o := ordOrder{Kase: kase, SKU: sku}
	if err := tx.Create(&o).Error; err != nil {
		guard.AbortStale(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"order": o.ID})
}

// ordReply is an answer as the table compares it.
type ordReply struct {
	answer   string
	replayed bool
	body     string
}

func (rig *ordRig) send(ctx context.Context, kase, sku, key, first string) ordReply {
	rig.t.Helper()
	id := fmt.Sprintf("%s-%d", kase, time.Now().UnixNano())
	done := make(chan struct{})
	rig.mu.Lock()
	rig.done[id] = done
	rig.mu.Unlock()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rig.in.srv.URL+"/buy/"+sku, strings.NewReader(`{"qty":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Case", kase)
	req.Header.Set("X-First", first)
	req.Header.Set("X-Req", id)
	resp, err := client.Do(req)
	var out ordReply
	if err != nil {
		if ctx.Err() == nil {
			rig.t.Errorf("%s: %v", kase, err)
		}
		out.answer = "gone"
	} else {
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		out.body = buf.String()
		out.answer = fmt.Sprint(resp.StatusCode)
		var v struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(out.body), &v) == nil && v.Error != "" {
			out.answer += " " + v.Error
		}
		out.replayed = resp.Header.Get(guard.ReplayedHeader) == "true"
	}
	select { // the server is done with it, whatever the client saw
	case <-done:
	case <-time.After(10 * time.Second):
		rig.t.Fatalf("%s: the server did not finish the request", kase)
	}
	return out
}

func (rig *ordRig) ran(kase string) int {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return rig.runs[kase]
}

func (rig *ordRig) addItem(sku string) {
	if err := rig.db.Create(&ordItem{SKU: sku, Stock: 100}).Error; err != nil {
		rig.t.Fatal(err)
	}
}

// orders returns the committed orders of a case.
func (rig *ordRig) orders(kase string) []ordOrder {
	var out []ordOrder
	if err := rig.db.Where("kase = ?", kase).Find(&out).Error; err != nil {
		rig.t.Fatal(err)
	}
	return out
}

// first runs a case's first request and returns its answer.
func (rig *ordRig) first(c ordCase, kase, sku string) ordReply {
	t := rig.t
	switch c.name {
	case "created":
		return rig.send(context.Background(), kase, sku, kase, "buy")
	case "handler 4xx":
		return rig.send(context.Background(), kase, sku, kase, "sold out")
	case "handler 5xx":
		return rig.send(context.Background(), kase, sku, kase, "downstream")
	case "panic":
		return rig.send(context.Background(), kase, sku, kase, "panic")
	case "stale write reported":
		r := rig.send(context.Background(), kase, sku, kase, "newer holder")
		if err := rig.db.Exec("UPDATE ord_items SET fence = 0 WHERE sku = ?", sku).Error; err != nil {
			t.Fatal(err)
		}
		return r
	case "lock lost":
		return rig.send(context.Background(), kase, sku, kase, "lost")
	case "lost in a later member's turn":
		// The first request leads a batch and buys; a second request of the
		// same SKU, taken into its batch, pauses past the lock's lease.
		gate, entered := make(chan struct{}), make(chan struct{})
		rig.mu.Lock()
		rig.gates[kase], rig.entered[kase] = gate, entered
		rig.mu.Unlock()
		var r ordReply
		var wg sync.WaitGroup
		wg.Go(func() { r = rig.send(context.Background(), kase, sku, kase, "buy") })
		<-entered
		wg.Go(func() { rig.send(context.Background(), kase+"-follower", sku, kase+"-follower", "pause") })
		rig.lines.wait(t, "ord:"+sku, 1)
		close(gate)
		wg.Wait()
		return r
	case "batch COMMIT fails":
		rig.session.armed.Store(true)
		r := rig.send(context.Background(), kase, sku, kase, "buy")
		if rig.session.armed.Load() {
			t.Fatalf("%s: no COMMIT was killed", kase)
		}
		return r
	case "client gone":
		// Another process holds the SKU's lock; the client gives up while
		// the request waits for it.
		locks := lock.New(rig.in.rdb)
		defer locks.Close()
		m := locks.Mutex("ord:" + sku)
		held, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer m.Unlock(held)
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan ordReply, 1)
		go func() { got <- rig.send(ctx, kase, sku, kase, "buy") }()
		eventually(t, func() bool {
			rig.mu.Lock()
			defer rig.mu.Unlock()
			return rig.locks["ord:"+sku] > 0
		})
		cancel()
		return <-got
	}
	t.Fatalf("no case %q", c.name)
	return ordReply{}
}

// TestOrder_EveryArrangementGivesTheSameAnswersAndRecords: Lock and
// Idempotent composed in every order (router-level Use of either with the
// other on the route, both on the route in both orders, Policies), on a
// plain and on a combining route, against real Redis and MariaDB: for each
// thing the first request with a key runs into, every order answers it
// alike and makes the retry alike (replayed or run again), and only a
// committed, handler-made answer is ever replayed.
func TestOrder_EveryArrangementGivesTheSameAnswersAndRecords(t *testing.T) {
	srv := testenv.Redis(t)
	db := openOrdDB(t)
	lines := watchLines(t)
	for ai, a := range arrangements {
		for _, combining := range []bool{false, true} {
			mode := "plain"
			if combining {
				mode = "combining"
			}
			t.Run(a.name+"/"+mode, func(t *testing.T) {
				rig := newOrdRig(t, srv, db, lines, a, combining, fmt.Sprintf("a%d%c", ai, mode[0]))
				for ci, c := range ordCases {
					if c.combining && !combining {
						continue
					}
					kase := fmt.Sprintf("%s-c%d", rig.prefix, ci)
					sku := kase
					rig.addItem(sku)
					got := rig.first(c, kase, sku)
					if got.answer != c.answer || got.replayed {
						t.Errorf("%s: the first request was answered %q (replayed %v), want %q", c.name, got.answer, got.replayed, c.answer)
					}
					before := rig.ran(kase)
					retry := rig.send(context.Background(), kase, sku, kase, "buy")
					ran := rig.ran(kase) > before
					switch {
					case c.replayed && (ran || !retry.replayed || retry.body != got.body):
						t.Errorf("%s: the retry ran %v, answered %s %s (replayed %v); want the first answer %s replayed", c.name, ran, retry.answer, retry.body, retry.replayed, got.body)
					case !c.replayed && (!ran || retry.replayed || retry.answer != "201"):
						t.Errorf("%s: the retry ran %v, answered %s (replayed %v); want it to run again and buy", c.name, ran, retry.answer, retry.replayed)
					}
					// One order per case: the retry's, or the first's replayed.
					orders := rig.orders(kase)
					if len(orders) != 1 {
						t.Errorf("%s: %d committed orders, want 1", c.name, len(orders))
					} else if want := fmt.Sprintf(`{"order":%d}`, orders[0].ID); retry.body != want {
						t.Errorf("%s: the retry answered %s; the committed order is %s", c.name, retry.body, want)
					}
				}
			})
		}
	}
}

// TestOrder_ConcurrentDuplicatesRunOnceInEveryArrangement: a duplicate of a
// request still running, in every arrangement: the handler runs once, the
// duplicate gets the arrangement's transient answer (documented on
// Idempotent), and the retry after both is replayed the committed answer.
func TestOrder_ConcurrentDuplicatesRunOnceInEveryArrangement(t *testing.T) {
	srv := testenv.Redis(t)
	db := openOrdDB(t)
	lines := watchLines(t)
	for ai, a := range arrangements {
		for _, combining := range []bool{false, true} {
			mode := "plain"
			if combining {
				mode = "combining"
			}
			t.Run(a.name+"/"+mode, func(t *testing.T) {
				rig := newOrdRig(t, srv, db, lines, a, combining, fmt.Sprintf("d%d%c", ai, mode[0]))
				kase := rig.prefix + "-dup"
				sku := kase
				rig.addItem(sku)
				gate, entered := make(chan struct{}), make(chan struct{})
				rig.gates[kase], rig.entered[kase] = gate, entered
				var first, dup ordReply
				var dupDone atomic.Bool
				var wg sync.WaitGroup
				wg.Go(func() { first = rig.send(context.Background(), kase, sku, kase, "buy") })
				<-entered
				wg.Go(func() { dup = rig.send(context.Background(), kase, sku, kase, "buy"); dupDone.Store(true) })
				// The duplicate is answered, or waits: for the lock, or in
				// the combining line.
				eventually(t, func() bool {
					rig.mu.Lock()
					waiting := rig.locks["ord:"+sku] > 1
					rig.mu.Unlock()
					lines.mu.Lock()
					inLine := lines.n["ord:"+sku] > 0
					lines.mu.Unlock()
					return dupDone.Load() || waiting || inLine
				})
				close(gate)
				wg.Wait()
				var want string
				switch {
				case a.idemOutside:
					want = "409 request_in_progress"
				case combining:
					want = "409 request_in_progress" // in the first's batch
				default:
					want = "201 replayed" // after waiting for the lock
				}
				got := dup.answer
				if dup.replayed {
					got += " replayed"
				}
				if first.answer != "201" || got != want {
					t.Errorf("first %s, duplicate %s; want 201 and %s", first.answer, got, want)
				}
				if dup.replayed && dup.body != first.body {
					t.Errorf("the duplicate was replayed %s, the first answered %s", dup.body, first.body)
				}
				t.Logf("%s, %s: a duplicate of a running request gets %s", a.name, mode, want)
				retry := rig.send(context.Background(), kase, sku, kase, "buy")
				if n := rig.ran(kase); n != 1 || !retry.replayed || retry.body != first.body {
					t.Errorf("handler runs %d, retry %s %s (replayed %v); want one run and the first answer replayed", n, retry.answer, retry.body, retry.replayed)
				}
				if orders := rig.orders(kase); len(orders) != 1 {
					t.Errorf("%d orders, want 1", len(orders))
				}
			})
		}
	}
}
