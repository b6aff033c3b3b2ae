package reliability

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// replOffset reads a server's replication offset: master_repl_offset on a
// master, slave_repl_offset (how much of its master's stream it applied)
// on a replica.
func replOffset(t testing.TB, s *testenv.RedisServer, field string) int64 {
	t.Helper()
	info, _ := s.Do("INFO", "replication").(string)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO replication %s: %q", field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO replication of %s has no %s", s.Addr, field)
	return 0
}

// Real replication lag on failover. A master and a replica spawned for the
// test, the replica's link to its master running through a fault proxy. The
// proxy stops delivering: the master goes on streaming its writes (the proxy
// takes them), the replica receives none — lag, measured in replication
// offsets, and WAIT 1 answers 0. Holder a takes the lock on the master and
// reads; the lagging replica is promoted (REPLICAOF NO ONE) without the lock
// or the token counter. b takes the lock on the new master — its token is
// newer although the counter it came from never saw a's — and writes.
//
// a is still connected to the old master, as clients are until a failover
// redirects them, and its renewals succeed there: its write, sent before it
// could know, is refused by the fence. The clients are then redirected (the
// old master drops its clients and becomes a replica of the new one): a's
// next renewal, on the new master, finds the lock gone and a is told. The
// history, token order included, is clean.
func TestFailover_LaggingReplicaPromotedUnderAHolderFencesAndTellsIt(t *testing.T) {
	const (
		key      = "sku:lag"
		watchdog = 3 * time.Second
	)
	db, _ := registers(t, key)
	master := testenv.Redis(t)
	master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	link, err := faults.NewProxy(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	replica := testenv.Redis(t)
	_, linkPort, _ := net.SplitHostPort(link.Addr)
	replica.Do("REPLICAOF", "127.0.0.1", linkPort)
	eventually(t, 10*time.Second, "the replica in sync through the link", func() bool {
		info, _ := replica.Do("INFO", "replication").(string)
		return strings.Contains(info, "master_link_status:up")
	})
	master.Do("SET", "lag:warm-up", 1)
	if n := master.Do("WAIT", 1, 5000); n != int64(1) {
		t.Fatalf("the replica did not acknowledge a write: WAIT 1 = %v", n)
	}

	// a's client dials wherever the service's Redis address points, as a
	// client behind a virtual IP or a Sentinel lookup does.
	var target atomic.Pointer[string]
	target.Store(&master.Addr)
	ac := lockClient(t, master.Addr, func(o *redis.Options) {
		o.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *target.Load())
		}
	}, lock.WithWatchdogTimeout(watchdog))
	bc := lockClient(t, replica.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	rec := history.NewRecorder()

	// The link stops delivering; a takes the lock on the master only.
	link.SetBlackhole(true)
	t.Cleanup(func() { link.SetBlackhole(false) })
	actx, err := ac.Mutex(key).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := enter(rec, "a", key, actx)
	if err := a.Read(db); err != nil {
		t.Fatal(err)
	}
	acked := master.Do("WAIT", 1, 200)
	lag := replOffset(t, master, "master_repl_offset") - replOffset(t, replica, "slave_repl_offset")
	if lag <= 0 || acked != int64(0) || replica.Do("EXISTS", key) != int64(0) {
		t.Fatalf("no lag: the replica is %d bytes behind, WAIT 1 = %v, the lock on the replica: %v", lag, acked, replica.Do("EXISTS", key))
	}

	// The lagging replica is promoted; b gets the lock there at once.
	replica.Do("REPLICAOF", "NO", "ONE")
	bctx, err := bc.Mutex(key).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatalf("b on the promoted replica: %v", err)
	}
	b := enter(rec, "b", key, bctx)
	if b.Token() <= a.Token() {
		t.Fatalf("b's token %d on the promoted replica is not above a's %d", b.Token(), a.Token())
	}
	if err := b.Read(db); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(db, true); err != nil {
		t.Fatalf("b's write: %v", err)
	}

	// a, renewed by the old master, writes: the fence refuses it.
	if err := actx.Err(); err != nil {
		t.Fatalf("a was told before its write (%v): the old master should still renew it", context.Cause(actx))
	}
	early, err := a.Write(db, true)
	var se *fencing.StaleError
	if early.Accepted || !errors.As(err, &se) || se.Current != fencing.Token(b.Token()) {
		t.Fatalf("a's write after the failover: %v (accepted %v), want refused by the fence naming b's token %d", err, early.Accepted, b.Token())
	}

	// The failover completes: clients are redirected to the new master and
	// the old one becomes its replica.
	redirected := history.Now()
	target.Store(&replica.Addr)
	_, newPort, _ := net.SplitHostPort(replica.Addr)
	master.Do("REPLICAOF", "127.0.0.1", newPort)
	master.Do("CLIENT", "KILL", "TYPE", "normal")
	select {
	case <-actx.Done():
	case <-time.After(2 * watchdog):
		t.Fatal("a, whose lock the promoted replica never had, was never told")
	}
	cause := context.Cause(actx)
	if !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("a's context ended with %v, want lock.ErrLost", cause)
	}
	eventually(t, time.Second, "the loss recorded", func() bool { return a.lostAt.Load() != 0 })
	told := time.Unix(0, a.lostAt.Load())
	if !early.End.Before(told) {
		t.Fatalf("a's write ended after its notice: the fence was not what refused it")
	}
	if w, err := a.Write(db, true); w.Accepted || !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("a's write after its notice: %v, want refused as stale", err)
	}
	a.Leave()
	b.Leave()
	_ = bc.Mutex(key).Unlock(bctx)
	r := check(t, rec, db, history.NoticeWithin(2*watchdog))
	t.Logf("replica %d bytes behind (WAIT 1 = %v); a token %d, b %d; a's write refused by the fence; a told %v after the redirection (%v); %s",
		lag, acked, a.Token(), b.Token(), told.Sub(redirected).Round(time.Millisecond), cause, r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
}
