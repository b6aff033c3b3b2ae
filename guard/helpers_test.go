package guard_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

func init() { gin.SetMode(gin.TestMode) }

// quiet discards the Guard's log lines in tests that provoke them.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// instance is one process of a service: its own Redis client, Guard, gin
// engine and HTTP server.
type instance struct {
	g   *guard.Guard
	r   *gin.Engine
	srv *httptest.Server
	rdb *redis.Client
}

// newInstance starts an instance on srv; routes registers its routes.
func newInstance(t testing.TB, srv *testenv.RedisServer, routes func(g *guard.Guard, r *gin.Engine), opts ...guard.Option) *instance {
	t.Helper()
	rdb := srv.Client(func(o *redis.Options) { o.PoolSize = 64 })
	opts = append([]guard.Option{guard.WithLogger(quiet), guard.WithLockOptions(lock.WithWatchdogTimeout(3 * time.Second))}, opts...)
	g := guard.New(rdb, opts...)
	t.Cleanup(func() { g.Close() })
	r := gin.New()
	r.Use(gin.CustomRecovery(func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
	routes(g, r)
	hs := httptest.NewServer(r)
	t.Cleanup(hs.Close)
	return &instance{g: g, r: r, srv: hs, rdb: rdb}
}

// reply is an HTTP answer read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// errorCode returns the "error" member of a JSON answer.
func (r reply) errorCode() string {
	var v struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(r.body, &v)
	return v.Error
}

var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// do sends a request; headers alternate name, value.
func do(t testing.TB, method, url, body string, headers ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = io.Copy(&buf, resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }
