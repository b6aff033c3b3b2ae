package ginmw

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// recordOn serves req through an engine whose route records the response of
// handler, and returns what the client got and the recorder.
func recordOn(t *testing.T, limit int, handler gin.HandlerFunc) (*httptest.ResponseRecorder, *Recorder) {
	t.Helper()
	var rec *Recorder
	r := gin.New()
	r.POST("/o", func(c *gin.Context) { rec = Record(c, limit) }, handler)
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/o", nil))
	return w, rec
}

func TestRecorder_CapturesStatusHeadersAndBody(t *testing.T) {
	w, rec := recordOn(t, 0, func(c *gin.Context) {
		c.Header("X-Order-ID", "o-1")
		c.Header("X-Internal", "secret")
		c.JSON(http.StatusCreated, gin.H{"order": "o-1"})
	})
	resp, err := rec.Response("x-order-id")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusCreated || string(resp.Body) != `{"order":"o-1"}` {
		t.Fatalf("recorded %d %q", resp.Status, resp.Body)
	}
	if got := resp.Header; len(got) != 2 || got.Get("X-Order-Id") != "o-1" || got.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("recorded headers %v, want Content-Type and X-Order-Id only", got)
	}
	if w.Code != http.StatusCreated || w.Body.String() != `{"order":"o-1"}` || w.Header().Get("X-Internal") != "secret" {
		t.Fatalf("client got %d %q %v", w.Code, w.Body, w.Header())
	}
}

func TestRecorder_KeepsHeadersAsSentNotAsChangedLater(t *testing.T) {
	_, rec := recordOn(t, 0, func(c *gin.Context) {
		c.Header("X-Step", "sent")
		c.String(http.StatusOK, "body")
		c.Header("X-Step", "too late")
		c.Header("X-Late", "too late")
	})
	resp, err := rec.Response("X-Step", "X-Late")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Step") != "sent" || resp.Header.Get("X-Late") != "" {
		t.Fatalf("recorded headers %v", resp.Header)
	}
}

func TestRecorder_HandlerThatWritesNothingRecordsStatusAndHeaders(t *testing.T) {
	w, rec := recordOn(t, 0, func(c *gin.Context) {
		c.Header("Location", "/o/1")
		c.Status(http.StatusNoContent)
	})
	resp, err := rec.Response("Location")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusNoContent || len(resp.Body) != 0 || resp.Header.Get("Location") != "/o/1" {
		t.Fatalf("recorded %+v", resp)
	}
	if w.Code != http.StatusNoContent {
		t.Fatalf("client got %d", w.Code)
	}
}

func TestRecorder_OverTheLimitIsReportedAndTheClientGetsEverything(t *testing.T) {
	big := strings.Repeat("x", 100)
	w, rec := recordOn(t, 99, func(c *gin.Context) {
		c.String(http.StatusOK, big[:50])
		c.String(http.StatusOK, big[50:])
	})
	if !rec.Exceeded() {
		t.Fatal("Exceeded() = false")
	}
	if _, err := rec.Response(); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("Response error = %v", err)
	}
	if w.Body.String() != big {
		t.Fatalf("client got %d bytes", w.Body.Len())
	}
}

func TestRecorder_ExactlyTheLimitIsKept(t *testing.T) {
	_, rec := recordOn(t, 100, func(c *gin.Context) {
		_, _ = c.Writer.WriteString(strings.Repeat("x", 60))
		_, _ = c.Writer.Write([]byte(strings.Repeat("y", 40)))
	})
	resp, err := rec.Response()
	if err != nil || len(resp.Body) != 100 || rec.Exceeded() {
		t.Fatalf("Response = %d bytes, %v", len(resp.Body), err)
	}
}

func TestRecorder_DefaultLimitIs64KiB(t *testing.T) {
	_, rec := recordOn(t, 0, func(c *gin.Context) { c.String(http.StatusOK, strings.Repeat("x", DefaultRecordLimit)) })
	if _, err := rec.Response(); err != nil {
		t.Fatal(err)
	}
	_, rec = recordOn(t, 0, func(c *gin.Context) { c.String(http.StatusOK, strings.Repeat("x", DefaultRecordLimit+1)) })
	if _, err := rec.Response(); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("Response error = %v", err)
	}
}

func TestRecorder_WriterStateMatchesGin(t *testing.T) {
	recordOn(t, 0, func(c *gin.Context) {
		w := c.Writer
		if _, ok := w.(*Recorder); !ok {
			t.Fatalf("c.Writer is %T", w)
		}
		if w.Written() || w.Size() != -1 || w.Status() != http.StatusOK {
			t.Errorf("fresh: Written %v Size %d Status %d", w.Written(), w.Size(), w.Status())
		}
		w.WriteHeader(http.StatusAccepted)
		if w.Written() || w.Status() != http.StatusAccepted {
			t.Errorf("after WriteHeader: Written %v Status %d", w.Written(), w.Status())
		}
		w.WriteHeaderNow()
		if !w.Written() || w.Size() != 0 {
			t.Errorf("after WriteHeaderNow: Written %v Size %d", w.Written(), w.Size())
		}
		w.WriteHeader(http.StatusTeapot) // too late; gin keeps the status sent
		_, _ = w.WriteString("abc")
		_, _ = w.Write([]byte("de"))
		if w.Size() != 5 || w.Status() != http.StatusAccepted {
			t.Errorf("after writes: Size %d Status %d", w.Size(), w.Status())
		}
		if w.Pusher() != nil {
			t.Errorf("Pusher() on a recorder over httptest = %v", w.Pusher())
		}
	})
}

func TestRecorder_StreamedWritesAreFlushedAndRecorded(t *testing.T) {
	chunkSeen := make(chan struct{})
	recorded := make(chan Response, 1)
	r := gin.New()
	r.GET("/stream", func(c *gin.Context) {
		rec := Record(c, 0)
		c.Next()
		resp, err := rec.Response()
		if err != nil {
			t.Error(err)
		}
		recorded <- resp
	}, func(c *gin.Context) {
		c.Header("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			c.SSEvent("n", i)
			c.Writer.Flush()
			if i == 0 {
				// The client must see the first event while the handler is
				// still running: Flush went through.
				select {
				case <-chunkSeen:
				case <-time.After(10 * time.Second):
					t.Error("first event not received before the handler finished")
				}
			}
		}
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, _ := br.ReadString('\n')
	close(chunkSeen)
	rest, _ := io.ReadAll(br)
	got := first + string(rest)
	want := "event:n\ndata:0\n\nevent:n\ndata:1\n\nevent:n\ndata:2\n\n"
	if got != want {
		t.Fatalf("client got %q", got)
	}
	rresp := <-recorded
	if string(rresp.Body) != want || !strings.HasPrefix(rresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("recorded %q %v", rresp.Body, rresp.Header)
	}
}

func TestRecorder_HijackedResponseCannotBeRecorded(t *testing.T) {
	var rec *Recorder
	done := make(chan error, 1)
	r := gin.New()
	r.GET("/ws", func(c *gin.Context) { rec = Record(c, 0) }, func(c *gin.Context) {
		conn, bw, err := c.Writer.Hijack()
		if err != nil {
			done <- err
			return
		}
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		_ = bw.Flush()
		_ = conn.Close()
		_, err = rec.Response()
		done <- err
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
	_, _ = io.ReadAll(conn)
	if err := <-done; !errors.Is(err, ErrHijacked) {
		t.Fatalf("Response after Hijack = %v, want ErrHijacked", err)
	}
}

func TestReplay_ReproducesTheRecordedResponseWithoutRunningTheHandler(t *testing.T) {
	_, rec := recordOn(t, 0, func(c *gin.Context) {
		c.Header("Location", "/orders/7")
		c.Header("Set-Cookie", "session=first")
		c.JSON(http.StatusCreated, gin.H{"order": 7})
	})
	stored, err := rec.Response("Location")
	if err != nil {
		t.Fatal(err)
	}
	handlerRan := false
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		c.Header("Idempotent-Replayed", "true")
		c.Header("Location", "/overwritten")
		Replay(c, stored)
	}, func(c *gin.Context) { handlerRan = true })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/o", nil))
	if handlerRan {
		t.Fatal("the handler ran after Replay")
	}
	if w.Code != http.StatusCreated || w.Body.String() != `{"order":7}` {
		t.Fatalf("replayed %d %q", w.Code, w.Body)
	}
	h := w.Header()
	if h.Get("Location") != "/orders/7" || h.Get("Content-Type") != "application/json; charset=utf-8" ||
		h.Get("Idempotent-Replayed") != "true" || h.Get("Set-Cookie") != "" {
		t.Fatalf("replayed headers %v", h)
	}
}

func TestReplay_EmptyBodyAndZeroStatus(t *testing.T) {
	r := gin.New()
	r.GET("/a", func(c *gin.Context) { Replay(c, Response{Status: http.StatusNoContent}) })
	r.GET("/b", func(c *gin.Context) { Replay(c, Response{Body: []byte("x")}) })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/a", nil))
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Fatalf("/a replayed %d %q", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/b", nil))
	if w.Code != http.StatusOK || w.Body.String() != "x" {
		t.Fatalf("/b replayed %d %q", w.Code, w.Body)
	}
}

func TestReplay_AfterAWriteOnlyAborts(t *testing.T) {
	r := gin.New()
	r.GET("/a", func(c *gin.Context) {
		c.String(http.StatusOK, "first")
		Replay(c, Response{Status: http.StatusCreated, Body: []byte("second")})
	}, func(c *gin.Context) { t.Error("the chain went on after Replay") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/a", nil))
	if w.Code != http.StatusOK || w.Body.String() != "first" {
		t.Fatalf("got %d %q", w.Code, w.Body)
	}
}
