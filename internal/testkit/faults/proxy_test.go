package faults

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// proxied returns a proxy in front of a fresh redis-server and a client
// through it that never retries, so every fault shows as an error.
func proxied(t *testing.T) (*Proxy, *redis.Client, *testenv.RedisServer) {
	t.Helper()
	srv := testenv.Redis(t)
	p, err := NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return p, c, srv
}

func TestProxy_RelaysUntouchedByDefault(t *testing.T) {
	_, c, srv := proxied(t)
	ctx := context.Background()
	for i := range 50 {
		if err := c.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := srv.Do("GET", "k49"); got != "49" {
		t.Fatalf("k49 = %v on the server", got)
	}
}

func TestProxy_LatencyDelaysEachDirection(t *testing.T) {
	p, c, _ := proxied(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // connect first
		t.Fatal(err)
	}
	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 200*time.Millisecond || rtt > 900*time.Millisecond {
		t.Fatalf("round trip with 100ms each way took %v", rtt)
	}
	p.SetLatency(0)
	start = time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt > 150*time.Millisecond {
		t.Fatalf("round trip after the latency was removed took %v", rtt)
	}
}

func TestProxy_BlackholeHoldsDataUntilHealed(t *testing.T) {
	p, c, srv := proxied(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetBlackhole(true)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Set(short, "k", "v", 0).Err(); err == nil {
		t.Fatal("a command went through the blackhole")
	}
	if got := srv.Do("EXISTS", "k"); got != int64(0) {
		t.Fatal("the command reached the server through the blackhole")
	}
	p.SetBlackhole(false)
	// The client gave up on its connection; a new one works.
	if err := c.Set(ctx, "k2", "v", 0).Err(); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}

func TestProxy_DropClosesOpenAndNewConnections(t *testing.T) {
	p, c, _ := proxied(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetDrop(true)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping through a dropping proxy succeeded")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a new connection through a dropping proxy succeeded")
	}
	if s := p.Stats(); s.Refused == 0 {
		t.Fatalf("stats %+v: no connection refused", s)
	}
	p.SetDrop(false)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("after the drop ended: %v", err)
	}
}

func TestProxy_ResetAllResetsOpenConnections(t *testing.T) {
	p, c, _ := proxied(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(200 * time.Millisecond)
	got := make(chan error, 1)
	go func() { got <- c.Ping(ctx).Err() }() // in flight when the reset comes
	time.Sleep(50 * time.Millisecond)
	p.ResetAll()
	if err := <-got; err == nil {
		t.Fatal("a ping in flight on a reset connection succeeded")
	}
	p.SetLatency(0)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("a new connection after the reset: %v", err)
	}
}

func TestProxy_ResetRateLosesRequestsAndReplies(t *testing.T) {
	p, c, srv := proxied(t)
	ctx := context.Background()
	p.SetResetRate(0.2)
	var failed, lostReplies int
	for i := range 200 {
		k := "k" + strconv.Itoa(i)
		if err := c.Set(ctx, k, 1, 0).Err(); err != nil {
			failed++
			if srv.Do("EXISTS", k) == int64(1) {
				lostReplies++ // the command ran, only its reply was lost
			}
		}
	}
	s := p.Stats()
	if failed < 10 || failed > 150 || s.Resets < int64(failed) {
		t.Fatalf("%d of 200 commands failed, %d resets: want about a third with rate 0.2 each way", failed, s.Resets)
	}
	if lostReplies == 0 || lostReplies == failed {
		t.Fatalf("%d of %d failures lost only the reply: want both kinds", lostReplies, failed)
	}
	p.SetResetRate(0)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestProxy_CloseLeavesNoGoroutines(t *testing.T) {
	srv := testenv.Redis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p, err := NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, PoolSize: 8})
	ctx := context.Background()
	p.SetLatency(20 * time.Millisecond)
	p.SetBlackhole(true)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- c.Ping(ctx).Err() }() // stuck in the blackhole
	}
	time.Sleep(50 * time.Millisecond)
	if s := p.Stats(); s.Open == 0 {
		t.Fatalf("stats %+v: no open connection", s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if err := <-errs; err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("ping through a closed proxy: %v", err)
		}
	}
	c.Close()
	if s := p.Stats(); s.Open != 0 {
		t.Fatalf("stats after Close %+v", s)
	}
}

func TestProxy_LoseReplyToRunsTheCommandAndLosesItsAnswer(t *testing.T) {
	p, c, srv := proxied(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{})
	lost := p.LoseReplyTo(Containing([]byte("lost-reply")), func() { close(arrived) })
	if err := c.Set(ctx, "lost-reply", "v", 0).Err(); err == nil {
		t.Fatal("the reply of the armed command came through")
	}
	<-arrived
	<-lost
	if got := srv.Do("GET", "lost-reply"); got != "v" {
		t.Fatalf("the server did not run the command whose reply was lost: GET = %v", got)
	}
	// One shot: the next command and its answer pass.
	if err := c.Set(ctx, "lost-reply", "w", 0).Err(); err != nil {
		t.Fatalf("after the lost reply: %v", err)
	}
}
