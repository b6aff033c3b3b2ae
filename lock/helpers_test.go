package lock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// instances returns n lock Clients on server, each with its own go-redis
// client, as n processes of a service would have. They close when t ends.
func instances(t testing.TB, srv *testenv.RedisServer, n int, opts ...lock.Option) []*lock.Client {
	t.Helper()
	out := make([]*lock.Client, n)
	for i := range out {
		c := lock.New(srv.Client(), opts...)
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

// proxied returns a fault proxy in front of srv and a go-redis client that
// reaches srv through it; both close when t ends.
func proxied(t testing.TB, srv *testenv.RedisServer) (*faults.Proxy, *redis.Client) {
	t.Helper()
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { rdb.Close() })
	return p, rdb
}

// lockName returns a lock name unique to the test.
func lockName(t testing.TB) string {
	return "test:" + strings.ReplaceAll(t.Name(), "/", ":")
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// commandCalls returns how many times the server has run each command since
// its start, from INFO commandstats.
func commandCalls(t testing.TB, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		var n int64
		for _, ch := range num {
			n = n*10 + int64(ch-'0')
		}
		out[name] = n
	}
	return out
}

// delta returns after-before for every command that ran in between.
func delta(before, after map[string]int64) map[string]int64 {
	out := make(map[string]int64)
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
