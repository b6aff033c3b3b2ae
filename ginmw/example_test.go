package ginmw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/seckillguard/seckillguard/ginmw"
)

// A lock key from a path parameter; the template is parsed once, at
// registration, and resolved per request.
func ExampleTemplate_Resolve() {
	gin.SetMode(gin.TestMode)
	key := ginmw.MustParseTemplate("sku:<id>")
	r := gin.New()
	r.POST("/seckill/:id", func(c *gin.Context) {
		k, err := key.Resolve(c, ginmw.DefaultBodyLimit)
		if err != nil {
			ginmw.AbortError(c, err)
			return
		}
		fmt.Println(k)
	})
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/seckill/42", nil))
	// Output: sku:42
}

// An idempotency key from the caller's identity (set by an authentication
// middleware) and a field of the JSON body; the handler still binds the
// whole body afterwards.
func ExampleTemplate_Resolve_body() {
	gin.SetMode(gin.TestMode)
	key := ginmw.MustParseTemplate("order:<ctx:user_id>:<body:order.no>")
	r := gin.New()
	r.POST("/orders", func(c *gin.Context) { c.Set("user_id", 1001) }, func(c *gin.Context) {
		k, err := key.Resolve(c, 0)
		if err != nil {
			ginmw.AbortError(c, err)
			return
		}
		var req struct {
			Order struct{ No, SKU string }
		}
		_ = c.ShouldBindJSON(&req)
		fmt.Println(k, req.Order.SKU)
	})
	body := `{"order":{"no":"N-7","sku":"s-42"}}`
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body)))
	// Output: order:1001:N-7 s-42
}

// A value that could forge a key is refused with 400 and the field's name.
func ExampleAbortError() {
	gin.SetMode(gin.TestMode)
	key := ginmw.MustParseTemplate("{sku:<query:id>}")
	r := gin.New()
	r.GET("/stock", func(c *gin.Context) {
		if _, err := key.Resolve(c, 0); err != nil {
			ginmw.AbortError(c, err)
		}
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/stock?id=%7Bother%7D", nil))
	fmt.Println(w.Code, w.Body)
	// Output: 400 {"error":"unsafe_value","field":"id","detail":"value contains \"{\" or \"}\""}
}

func ExampleMustParseTemplate_panic() {
	defer func() { fmt.Println(recover()) }()
	ginmw.MustParseTemplate("sku:<id")
	// Output: ginmw: template "sku:<id" column 5: unclosed "<"
}

func ExampleAbort() {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/", func(c *gin.Context) {
		ginmw.Abort(c, http.StatusTooManyRequests, "busy", ginmw.RetryAfter(1500*time.Millisecond))
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Body)
	// Output: 429 2 {"error":"busy"}
}

// Recording a response and replaying it to a retry, without running the
// handler again.
func ExampleReplay() {
	gin.SetMode(gin.TestMode)
	var stored *ginmw.Response
	runs := 0
	r := gin.New()
	r.POST("/pay", func(c *gin.Context) {
		if stored != nil {
			c.Header("Idempotent-Replayed", "true")
			ginmw.Replay(c, *stored)
			return
		}
		rec := ginmw.Record(c, 0)
		c.Next()
		if resp, err := rec.Response("Location"); err == nil && resp.Status < 500 {
			stored = &resp
		}
	}, func(c *gin.Context) {
		runs++
		c.Header("Location", "/payments/1")
		c.JSON(http.StatusCreated, gin.H{"payment": 1})
	})
	for i := 0; i < 2; i++ {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/pay", nil))
		fmt.Println(w.Code, w.Header().Get("Location"), w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 /payments/1  {"payment":1}
	// 201 /payments/1 true {"payment":1}
	// handler runs: 1
}
