package lock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// namesOn returns n lock names whose slots the master m serves.
func namesOn(t *testing.T, rdb *redis.ClusterClient, m *testenv.RedisServer, prefix string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		if i > 10000 {
			t.Fatalf("no names on %s", m.Addr)
		}
		name := fmt.Sprintf("%s:%d", prefix, i)
		node, err := rdb.MasterForKey(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == m.Addr {
			out = append(out, name)
		}
	}
	return out
}

// replOffset returns s's replication offset.
func replOffset(s *testenv.RedisServer) string {
	info, _ := s.Do("INFO", "replication").(string)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_repl_offset:"); ok {
			return v
		}
	}
	return "?"
}

// After a master of a Cluster dies and its replica takes over, every lock
// Client whose go-redis client still routes the master's slots to the dead
// node gets a dial error there. Nobody calls ReloadState here: the lock
// Client has the slot map reloaded itself and retries, so an Unlock
// releases at once (not when the background retry gets through once
// go-redis looks again by itself, seconds later), an acquisition succeeds,
// and the watchdog keeps its locks.
func TestCluster_FailoverIsFollowedWithoutAReloadByTheCaller(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	env := testenv.Cluster(t, 3)
	dead := env.Masters[0]
	replica := env.AddReplica(dead)
	names := namesOn(t, env.Client(), dead, lockName(t), 3)
	released, kept, taken := names[0], names[1], names[2]
	bg := context.Background()

	// Three Clients, each with a go-redis client of its own that has loaded
	// its slot map (and pooled a connection to the master) before it dies.
	// go-redis dials a node that is gone once, not five times 100ms apart
	// (its default), so that a call to it fails within the short leases of
	// this test.
	client := func() *redis.ClusterClient {
		return env.Client(func(o *redis.ClusterOptions) { o.DialerRetries = 1 })
	}
	releaser := lock.New(client(), lock.WithWatchdogTimeout(timeout))
	keeper := lock.New(client(), lock.WithWatchdogTimeout(timeout))
	taker := lock.New(client(), lock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { releaser.Close(); keeper.Close(); taker.Close() })
	held, err := releaser.Mutex(released).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	keptCtx, err := keeper.Mutex(kept).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	warm, err := taker.Mutex(taken).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := taker.Mutex(taken).Unlock(warm); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the replica in sync with the locks", func() bool {
		return replOffset(dead) == replOffset(replica)
	})

	// The master dies; its replica takes over at once (as an election
	// would after the node timeout), and the other masters learn it.
	dead.Kill()
	failedOver := time.Now()
	if r := replica.Do("CLUSTER", "FAILOVER", "TAKEOVER"); r != "OK" {
		t.Fatalf("CLUSTER FAILOVER TAKEOVER = %v", r)
	}
	eventually(t, 5*time.Second, "the replica serves the slots on every master", func() bool {
		if info, _ := replica.Do("INFO", "replication").(string); !strings.Contains(info, "role:master") {
			return false
		}
		for _, m := range env.Masters[1:] {
			slots, _ := m.Do("CLUSTER", "SLOTS").([]any)
			if !strings.Contains(fmt.Sprint(slots), fmt.Sprint(replica.Port)) {
				return false
			}
		}
		return true
	})
	t.Logf("failover done %v after the master died", time.Since(failedOver).Round(time.Millisecond))

	start := time.Now()
	err = releaser.Mutex(released).Unlock(held)
	t.Logf("Unlock after the failover took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("Unlock after the failover = %v, want nil; the lock on the new master: %v, PTTL %v",
			err, replica.Do("HGETALL", released), replica.Do("PTTL", released))
	}
	if n := replica.Do("EXISTS", released); n != int64(0) {
		t.Errorf("the lock is still on the new master after its Unlock returned (PTTL %v)", replica.Do("PTTL", released))
	}

	ctx, err := taker.Mutex(taken).TryLock(bg, 0)
	if err != nil {
		t.Errorf("an acquisition after the failover = %v, want the lock", err)
	} else if err := taker.Mutex(taken).Unlock(ctx); err != nil {
		t.Errorf("its Unlock = %v", err)
	}

	// The keeper's lock outlives its lease, renewed last at most a third
	// of it before the failover: its renewals reach the new master.
	select {
	case <-keptCtx.Done():
		t.Errorf("the watchdog lost a lock the new master has: %v", context.Cause(keptCtx))
	case <-time.After(time.Until(failedOver.Add(timeout + timeout/2))):
		if n := replica.Do("EXISTS", kept); n != int64(1) {
			t.Errorf("the kept lock is gone from the new master")
		}
		if err := keeper.Mutex(kept).Unlock(keptCtx); err != nil {
			t.Errorf("Unlock of the kept lock = %v", err)
		}
	}
}
