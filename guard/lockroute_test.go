package guard_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

func TestLock_RouterLevelPassesRoutesWithoutItsPathParameters(t *testing.T) {
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Lock("sku:<id>", guard.Wait(0)))
		r.GET("/healthz", func(c *gin.Context) { c.String(200, "ok key=%q", guard.Key(c)) })
		r.POST("/buy/:id", func(c *gin.Context) { c.String(200, guard.Key(c)) })
		r.POST("/orders", func(c *gin.Context) { c.String(201, "key=%q", guard.Key(c)) })
	})
	url := in.srv.URL
	if r := do(t, "GET", url+"/healthz", ""); r.status != 200 || string(r.body) != `ok key=""` {
		t.Errorf("GET /healthz: %d %s, want 200 untouched", r.status, r.body)
	}
	// The query and the body are not where a router-level lock looks for
	// a route's key: /orders has no :id, whatever the request carries.
	if r := do(t, "POST", url+"/orders?id=7", `{"id":"8"}`); r.status != 201 || string(r.body) != `key=""` {
		t.Errorf("POST /orders: %d %s, want 201 untouched", r.status, r.body)
	}
	if r := do(t, "GET", url+"/nope", ""); r.status != 404 {
		t.Errorf("unknown route: %d %s, want gin's 404", r.status, r.body)
	}
	if r := do(t, "POST", url+"/buy/42", ""); r.status != 200 || string(r.body) != "sku:42" {
		t.Errorf("POST /buy/42: %d %s, want the lock sku:42", r.status, r.body)
	}
	keys, _ := in.rdb.Keys(context.Background(), "*").Result()
	if len(keys) != 1 || keys[0] != "redisson_lock_token:{sku:42}" {
		t.Errorf("keys %v: only /buy/42 took a lock", keys)
	}
}

// logSink collects the records of a Guard's logger.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func TestLock_TemplateNamingAPathParameterTheRouteLacksIs500AndLoggedLoudly(t *testing.T) {
	srv := testenv.Redis(t)
	var sink logSink
	var ran bool
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/v1/:sku", g.Lock("sku:<path:id>"), func(c *gin.Context) { ran = true })
	}, guard.WithLogger(slog.New(slog.NewTextHandler(&sink, nil))))
	for range 3 {
		r := do(t, "POST", in.srv.URL+"/v1/s-1", "")
		if r.status != 500 || r.errorCode() != "lock_route_mismatch" {
			t.Fatalf("answer %d %s, want 500 lock_route_mismatch", r.status, r.body)
		}
	}
	if ran {
		t.Fatal("the handler ran without its lock")
	}
	log := sink.String()
	if n := strings.Count(log, "level=ERROR"); n != 1 || !strings.Contains(log, `/v1/:sku`) || !strings.Contains(log, `sku:<path:id>`) {
		t.Fatalf("want one error line naming the route and the template, got:\n%s", log)
	}
	if keys, _ := in.rdb.Keys(context.Background(), "*").Result(); len(keys) != 0 {
		t.Fatalf("keys %v", keys)
	}
}

// slowRequest starts a POST whose body arrives in two parts: the first
// byte now, the rest when send is called. answer reads the answer.
func slowRequest(t *testing.T, addr, path, body string, headers ...string) (send func(), answer func() (int, string)) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var head strings.Builder
	head.WriteString("POST " + path + " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n")
	for i := 0; i+1 < len(headers); i += 2 {
		head.WriteString(headers[i] + ": " + headers[i+1] + "\r\n")
	}
	head.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body[:1])
	if _, err := io.WriteString(conn, head.String()); err != nil {
		t.Fatal(err)
	}
	send = func() { _, _ = io.WriteString(conn, body[1:]) }
	answer = func() (int, string) {
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("reading the answer: %v", err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	return send, answer
}

// waitingBody signals waiting when a Read starts after some of the body
// has been read: the reader then waits for bytes the client has not sent.
type waitingBody struct {
	io.ReadCloser
	read    int
	waiting chan<- struct{}
}

func (b *waitingBody) Read(p []byte) (int, error) {
	if b.read > 0 && b.waiting != nil {
		b.waiting <- struct{}{}
		b.waiting = nil
	}
	n, err := b.ReadCloser.Read(p)
	b.read += n
	return n, err
}

func TestLock_SlowBodyNeverHoldsTheLock(t *testing.T) {
	srv := testenv.Redis(t)
	entered := make(chan struct{}, 1)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(func(c *gin.Context) {
			if c.GetHeader("X-Slow") != "" {
				c.Request.Body = &waitingBody{ReadCloser: c.Request.Body, waiting: entered}
			}
		})
		r.POST("/x/:id", g.Lock("sku:<id>", guard.Wait(0)), func(c *gin.Context) {
			b, err := io.ReadAll(c.Request.Body)
			if err != nil {
				c.Status(400)
				return
			}
			c.String(200, "%s", b)
		})
	})
	send, answer := slowRequest(t, in.srv.Listener.Addr().String(), "/x/1", `{"buyer":"slow"}`, "X-Slow", "1")
	<-entered
	// The slow client has sent one byte of its body, and whoever reads it
	// waits for the next: an honest buyer of the
	// same SKU is served at once, not answered busy.
	if r := do(t, "POST", in.srv.URL+"/x/1", `{"buyer":"honest"}`); r.status != 200 || string(r.body) != `{"buyer":"honest"}` {
		t.Fatalf("honest buyer: %d %s, want 200 while the slow body trickles in", r.status, r.body)
	}
	send()
	if status, body := answer(); status != 200 || body != `{"buyer":"slow"}` {
		t.Fatalf("slow buyer: %d %s, want 200 with its whole body", status, body)
	}
}

func TestLock_BodyReadHasADeadlineOfItsOwn(t *testing.T) {
	srv := testenv.Redis(t)
	entered := make(chan struct{}, 1)
	var ran bool
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(func(c *gin.Context) { entered <- struct{}{} })
		r.POST("/x/:id", g.Lock("sku:<id>", guard.BodyTimeout(200*time.Millisecond)), func(c *gin.Context) { ran = true })
	})
	_, answer := slowRequest(t, in.srv.Listener.Addr().String(), "/x/1", `{"buyer":"stalled"}`)
	<-entered
	status, body := answer() // the rest of the body never comes
	if status != http.StatusRequestTimeout || !strings.Contains(body, `"body_timeout"`) || ran {
		t.Fatalf("stalled body: %d %s (handler ran: %v), want 408 body_timeout", status, body, ran)
	}
}
