package guard_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
)

// One line per route: every instance of the service then serialises the
// work on one SKU, and answers 429 when it stays busy for 2 seconds.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb)
	defer g.Close()
	guard.SetDefault(g)

	r := gin.New()
	r.Use(guard.Lock("sku:<id>")) // <id>: the path parameter, else query, else body
	r.POST("/api/seckill/:id", func(c *gin.Context) {
		// c.Request.Context() holds the lock: pass it to the database
		// (db.WithContext) so that the writes are fenced.
		tok, _ := guard.Token(c)
		c.JSON(http.StatusCreated, gin.H{"locked": guard.Key(c), "fenced": tok.Valid()})
	})

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/api/seckill/42", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 201 {"fenced":true,"locked":"sku:42"}
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
