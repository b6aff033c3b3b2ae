package guard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
)

// One line for the router, or one per route: every instance of the service
// then serialises the work on one SKU, and answers 429 when it stays busy
// for 2 seconds.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb)
	defer g.Close()
	guard.SetDefault(g)

	r := gin.New()
	// Router-level: locks the routes that have an :id parameter; the
	// others (/healthz, unknown routes) pass untouched.
	r.Use(guard.Lock("sku:<id>"))
	r.GET("/healthz", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
	r.POST("/api/seckill/:id", func(c *gin.Context) {
		// c.Request.Context() holds the lock: pass it to the database
		// (db.WithContext(c.Request.Context())) so that the writes are
		// fenced.
		tok, _ := guard.Token(c)
		c.JSON(http.StatusCreated, gin.H{"locked": guard.Key(c), "fenced": tok.Valid()})
	})
	// Per route: the lock of this route only, with its own options.
	r.POST("/api/orders/:order", guard.Lock("order:<order>", guard.Wait(100*time.Millisecond)),
		func(c *gin.Context) { c.String(http.StatusCreated, guard.Key(c)) })

	for _, req := range []*http.Request{
		httptest.NewRequest("POST", "/api/seckill/42", nil),
		httptest.NewRequest("GET", "/healthz", nil),
		httptest.NewRequest("POST", "/api/orders/o-7", nil),
	} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String())
	}
	// Output:
	// 201 {"fenced":true,"locked":"sku:42"}
	// 200 ok
	// 201 order:o-7
}

// One Guard per process, one line per route: the instances of the service
// then run the purchases of a SKU one at a time, and answer 429 when the
// lock stays busy for the wait (2s by default). Ping at boot finds a wrong
// Redis address there rather than in the first requests' 503s.
func ExampleGuard_Lock() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb, guard.WithNamespace("shop")) // "shop:" before every key it writes
	defer g.Close()
	if err := g.Ping(context.Background()); err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.POST("/api/seckill/:sku", g.Lock("sku:<sku>"), func(c *gin.Context) {
		// c.Request.Context() holds the lock and its fencing token: give it to
		// the database, db.WithContext(c.Request.Context()), to fence the writes.
		c.JSON(http.StatusCreated, gin.H{"locked": guard.RedisKey(c)})
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/api/seckill/42", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 201 {"locked":"shop:sku:42"}
}

// The server in front of the middleware bounds how long a client may take
// to send its request. Lock reads the body before it takes the lock (within
// guard.BodyTimeout, 5s by default), so a slow client never holds a lock;
// ReadHeaderTimeout and ReadTimeout keep it from holding a connection and a
// goroutine for longer than that, also on routes without a lock.
func Example_server() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb)
	defer g.Close()

	r := gin.New()
	r.POST("/api/seckill/:sku", g.Lock("sku:<sku>"), func(c *gin.Context) { c.Status(http.StatusCreated) })
	srv := &http.Server{
		Addr:              ":8080",
		Handler:           r,
		ReadHeaderTimeout: 5 * time.Second,  // the request line and headers
		ReadTimeout:       10 * time.Second, // the whole request, body included
		WriteTimeout:      30 * time.Second, // the wait for the lock, the handler, the answer
		IdleTimeout:       60 * time.Second,
	}
	log.Fatal(srv.ListenAndServe())
}

// Every route's settings in one file, checked at boot.
func ExampleLoadPolicies() {
	pol, err := guard.LoadPolicies("testdata/guard.yaml")
	if err != nil {
		log.Fatal(err) // names the file and the line of any mistake
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb)
	defer g.Close()

	r := gin.New()
	r.Use(g.Policies(pol))
	r.POST("/api/seckill/:sku", func(c *gin.Context) { c.String(http.StatusOK, guard.Key(c)) })
	r.POST("/api/pay", func(c *gin.Context) { c.Status(http.StatusCreated) })
	r.POST("/api/orders/:order", func(c *gin.Context) { c.Status(http.StatusCreated) })
	if typos := pol.Unmatched(r.Routes()); len(typos) > 0 {
		log.Fatalf("policies for routes that do not exist: %v", typos)
	}

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/api/seckill/sku-1", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 200 sku:sku-1
}

// A payment endpoint that runs once per Idempotency-Key and caller; a retry
// gets the first answer again.
func ExampleGuard_Idempotent() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb)
	defer g.Close()

	charges := 0
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("user_id", c.GetHeader("X-User-ID")) }) // your authentication
	r.POST("/api/pay", g.Idempotent(guard.Scope("<ctx:user_id>")), func(c *gin.Context) {
		charges++
		c.JSON(http.StatusCreated, gin.H{"charge": charges})
	})

	for i := 0; i < 2; i++ {
		req := httptest.NewRequest("POST", "/api/pay", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		req.Header.Set("X-User-ID", "alice")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 {"charge":1} replayed: false
	// 201 {"charge":1} replayed: true
}
