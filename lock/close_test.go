package lock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// syncBuffer is a bytes.Buffer safe for the Client's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Close is not an outage: closing a Client whose waiters subscribed to
// unlock channels, some of them still waiting, logs nothing above debug
// level, on a single node and on a Cluster (a pub/sub connection per node).
func TestClient_CloseLogsNoFailure(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := testenv.Redis(t)
		closeLogsNoFailure(t, func() redis.UniversalClient { return srv.Client() })
	})
	t.Run("cluster", func(t *testing.T) {
		env := testenv.Cluster(t, 3)
		closeLogsNoFailure(t, func() redis.UniversalClient { return env.Client() })
	})
}

// The same when the go-redis client is closed first (deferred after the
// lock Client, a common order): the pub/sub connection closed locally is
// the end of the process's Redis, not an outage.
func TestClient_CloseAfterItsRedisClientLogsNoFailure(t *testing.T) {
	srv := testenv.Redis(t)
	holder := instances(t, srv, 1)[0]
	name := lockName(t)
	held, err := holder.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Mutex(name).Unlock(held)
	var logs syncBuffer
	rdb := srv.Client()
	c := lock.New(rdb, lock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	if _, err := c.Mutex(name).TryLock(context.Background(), 50*time.Millisecond); err == nil {
		t.Fatal("acquired a held lock")
	}
	rdb.Close()
	time.Sleep(200 * time.Millisecond) // what the reading goroutine logs when its connection closes
	c.Close()
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Fatalf("closing the Redis client and the Client logged a failure:\n%s", out)
	}
}

func closeLogsNoFailure(t *testing.T, rdb func() redis.UniversalClient) {
	holder := lock.New(rdb())
	defer holder.Close()
	name := lockName(t)
	var logs syncBuffer
	c := lock.New(rdb(), lock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	var held []context.Context
	waiting := make(chan error, 8)
	for i := 0; i < 8; i++ {
		m := fmt.Sprintf("%s:%d", name, i)
		ctx, err := holder.Mutex(m).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ctx)
		if i%2 == 0 {
			// A wait that subscribes and gives up: the subscription lingers.
			if _, err := c.Mutex(m).TryLock(context.Background(), 50*time.Millisecond); err == nil {
				t.Fatal("acquired a held lock")
			}
			waiting <- nil
			continue
		}
		go func() { _, err := c.Mutex(m).Lock(context.Background()); waiting <- err }()
	}
	if _, err := c.Mutex(name + ":mine").Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the waiters subscribe
	c.Close()
	for i := 0; i < 8; i++ {
		if err := <-waiting; err != nil && !errors.Is(err, lock.ErrClosed) {
			t.Errorf("waiter: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond) // anything the reading goroutines would log after Close
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Fatalf("Close logged a failure:\n%s", out)
	}
	for i, ctx := range held {
		holder.Mutex(fmt.Sprintf("%s:%d", name, i)).Unlock(ctx)
	}
}

// An unlock channel stays subscribed for 2s after its last waiter left, as
// docs/LOCKS.md says, then it is unsubscribed: a user counting
// subscriptions finds what the document tells.
func TestSubscription_LingersTwoSecondsAfterTheLastWaiter(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	channel := "redisson_lock__channel:{" + name + "}"
	count := func() int64 {
		n, err := srv.Client().PubSubNumSub(context.Background(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[channel]
	}
	held, err := cs[1].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].Mutex(name).TryLock(context.Background(), 100*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock of a held lock = %v", err)
	}
	left := time.Now()
	if n := count(); n != 1 {
		t.Fatalf("%d subscriptions right after the last waiter left, want 1 (it lingers)", n)
	}
	eventually(t, 5*time.Second, "the channel is unsubscribed", func() bool { return count() == 0 })
	d := time.Since(left)
	t.Logf("unsubscribed %v after the last waiter left", d)
	if d < 1900*time.Millisecond {
		t.Fatalf("unsubscribed %v after the last waiter left, want 2s as documented", d)
	}
	if err := cs[1].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
}
