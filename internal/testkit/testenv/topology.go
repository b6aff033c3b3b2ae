package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica starts a redis-server for t that replicates master, and waits until
// it has synced with it.
func Replica(t testing.TB, master *RedisServer, extra ...string) *RedisServer {
	t.Helper()
	// Full syncs start at once rather than after the 5s Redis waits by
	// default for more replicas to share one.
	master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	r := Redis(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, extra...)...)
	waitFor(t, 10*time.Second, "replica "+r.Addr+" in sync with "+master.Addr, func() (bool, error) {
		info, err := infoField(r.Addr, "replication", "master_link_status")
		return info == "up", err
	})
	// After a diskless sync the master counts the replica in (for WAIT)
	// only once the replica's first acknowledgement arrives, up to a second
	// later.
	waitFor(t, 10*time.Second, "master "+master.Addr+" counting replica "+r.Addr+" online", func() (bool, error) {
		c := redis.NewClient(&redis.Options{Addr: master.Addr})
		defer c.Close()
		info, err := c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "port="+strconv.Itoa(r.Port)+",state=online"), err
	})
	// The first WAIT after a sync may still wait for the replica's periodic
	// acknowledgement (once a second); have it done before the test starts.
	c := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: 1}) // one connection: WAIT counts its writes
	defer c.Close()
	ctx := context.Background()
	c.Set(ctx, "testenv:replica-warm-up", 1, 0)
	c.Del(ctx, "testenv:replica-warm-up")
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("testenv: replica %s did not acknowledge a write within 5s: %d, %v", r.Addr, n, err)
	}
	return r
}

// A ClusterEnv is a Redis Cluster of spawned masters owned by one test: every
// node keeps nothing on disk and is killed when the test ends.
type ClusterEnv struct {
	Masters []*RedisServer
	t       testing.TB
}

var redisCLIPath = func() (string, error) {
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", fmt.Errorf("testenv: redis-cli not found in PATH: install it (Debian: apt-get install redis-tools)")
	}
	return p, nil
}

// Cluster starts a Redis Cluster of masters masters (at least 3, as
// redis-cli requires) on free loopback ports, no replicas, every slot
// assigned, and waits until every node reports the cluster ok.
func Cluster(t testing.TB, masters int) *ClusterEnv {
	t.Helper()
	if masters < 3 {
		t.Fatalf("testenv: a Redis Cluster needs at least 3 masters, not %d", masters)
	}
	cli, err := redisCLIPath()
	if err != nil {
		t.Fatal(err)
	}
	e := &ClusterEnv{t: t}
	args := []string{"--cluster", "create"}
	for i := 0; i < masters; i++ {
		bus, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s := Redis(t, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "3000", "--cluster-config-file", "nodes.conf")
		e.Masters = append(e.Masters, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v: %s", err, lastLines(string(out), 5))
	}
	for _, s := range e.Masters {
		waitFor(t, 15*time.Second, "cluster ok on "+s.Addr, func() (bool, error) {
			c := redis.NewClient(&redis.Options{Addr: s.Addr})
			defer c.Close()
			info, err := c.ClusterInfo(context.Background()).Result()
			return strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)), err
		})
	}
	return e
}

// Addrs returns the masters' addresses.
func (e *ClusterEnv) Addrs() []string {
	out := make([]string, len(e.Masters))
	for i, s := range e.Masters {
		out[i] = s.Addr
	}
	return out
}

// Client returns a go-redis Cluster client, closed when the test ends.
func (e *ClusterEnv) Client(opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: e.Addrs()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClusterClient(o)
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// A SentinelEnv is a master, one replica and three Sentinels watching them
// (quorum 2), owned by one test, on free loopback ports. Sentinels declare
// the master down after 300ms without answers, so a failover takes seconds.
type SentinelEnv struct {
	MasterName string
	Master     *RedisServer
	Replica    *RedisServer
	Sentinels  []*RedisServer
	t          testing.TB
}

// Sentinel starts a master, its replica and three Sentinels, and waits until
// every Sentinel knows the replica and the two other Sentinels (so that a
// failover can be agreed on at once).
func Sentinel(t testing.TB) *SentinelEnv {
	t.Helper()
	bin, err := redisPath()
	if err != nil {
		t.Fatal(err)
	}
	e := &SentinelEnv{MasterName: "seckillguard", t: t}
	e.Master = Redis(t)
	e.Replica = Replica(t, e.Master)
	// Each Sentinel is told about the replica and the other Sentinels in its
	// configuration, so that none has to wait for the discovery rounds
	// (10s of INFO, 2s of hello messages) before a failover can be agreed.
	ports := make([]int, 3)
	ids := make([]string, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			t.Fatal(err)
		}
		ids[i] = fmt.Sprintf("%040x", time.Now().UnixNano()+int64(i))
	}
	for i := range ports {
		known := fmt.Sprintf("sentinel known-replica %s 127.0.0.1 %d\n", e.MasterName, e.Replica.Port)
		for j := range ports {
			if j != i {
				known += fmt.Sprintf("sentinel known-sentinel %s 127.0.0.1 %d %s\n", e.MasterName, ports[j], ids[j])
			}
		}
		s, err := startSentinel(t.TempDir(), bin, e.MasterName, e.Master.Port, ports[i],
			"sentinel myid "+ids[i]+"\n"+known)
		if err != nil {
			t.Fatal(err)
		}
		s.t = t
		t.Cleanup(s.Kill)
		e.Sentinels = append(e.Sentinels, s)
	}
	for _, s := range e.Sentinels {
		waitFor(t, 20*time.Second, "sentinel "+s.Addr+" knows the replica and the other sentinels", func() (bool, error) {
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
			defer c.Close()
			m, err := c.Master(context.Background(), e.MasterName).Result()
			return m["num-slaves"] == "1" && m["num-other-sentinels"] == "2", err
		})
	}
	return e
}

// startSentinel starts a Sentinel in dir watching the master on masterPort,
// on port (or another free port if that one is taken meanwhile), with extra
// lines of configuration.
func startSentinel(dir, bin, name string, masterPort, port int, extra string) (*RedisServer, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			var err error
			if port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 300
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "redis.log"), name, masterPort, name, name, name) + extra
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
		s := &RedisServer{dir: dir, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			args: []string{conf, "--sentinel"}}
		if lastErr = s.start(bin); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("testenv: redis-server --sentinel did not start: %v", lastErr)
}

// SentinelAddrs returns the Sentinels' addresses.
func (e *SentinelEnv) SentinelAddrs() []string {
	out := make([]string, len(e.Sentinels))
	for i, s := range e.Sentinels {
		out[i] = s.Addr
	}
	return out
}

// FailoverClient returns a go-redis Sentinel failover client for the master,
// closed when the test ends.
func (e *SentinelEnv) FailoverClient(opts ...func(*redis.FailoverOptions)) *redis.Client {
	o := &redis.FailoverOptions{MasterName: e.MasterName, SentinelAddrs: e.SentinelAddrs()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewFailoverClient(o)
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// MasterAddr returns the master's address as the first Sentinel that answers
// names it.
func (e *SentinelEnv) MasterAddr() (string, error) {
	var lastErr error
	for _, s := range e.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		addr, err := c.GetMasterAddrByName(context.Background(), e.MasterName).Result()
		c.Close()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("testenv: no sentinel names the master: %v", lastErr)
}

// WaitForFailover waits until every Sentinel names the replica as the master
// and the replica says it is one, and fails the test after timeout.
func (e *SentinelEnv) WaitForFailover(timeout time.Duration) {
	e.t.Helper()
	waitFor(e.t, timeout, "failover to "+e.Replica.Addr, func() (bool, error) {
		for _, s := range e.Sentinels {
			if s.cmd == nil {
				continue
			}
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
			addr, err := c.GetMasterAddrByName(context.Background(), e.MasterName).Result()
			c.Close()
			if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != e.Replica.Addr {
				return false, nil
			}
		}
		role, err := infoField(e.Replica.Addr, "replication", "role")
		return role == "master", err
	})
}

// infoField returns one field of a server's INFO section.
func infoField(addr, section, field string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", nil
}

// waitFor polls cond every 50ms until it holds, and fails t after timeout
// with what it waited for and cond's last error.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: not within %v: %s (last error: %v)", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AddReplica starts a cluster node for e's test that replicates master (one
// of e.Masters) and waits until it is in sync and every master knows it. A
// master that dies is then replaced by it within the node timeout (3s) and
// a few seconds of election.
func (e *ClusterEnv) AddReplica(master *RedisServer) *RedisServer {
	t := e.t
	t.Helper()
	cli, err := redisCLIPath()
	if err != nil {
		t.Fatal(err)
	}
	bus, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	r := Redis(t, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
		"--cluster-node-timeout", "3000", "--cluster-config-file", "nodes.conf")
	id, _ := master.Do("CLUSTER", "MYID").(string)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, "--cluster", "add-node", r.Addr, master.Addr,
		"--cluster-slave", "--cluster-master-id", id).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster add-node: %v: %s", err, lastLines(string(out), 5))
	}
	waitFor(t, 15*time.Second, "replica "+r.Addr+" in sync with "+master.Addr, func() (bool, error) {
		info, err := infoField(r.Addr, "replication", "master_link_status")
		return info == "up", err
	})
	for _, m := range e.Masters {
		waitFor(t, 15*time.Second, m.Addr+" knowing replica "+r.Addr, func() (bool, error) {
			c := redis.NewClient(&redis.Options{Addr: m.Addr})
			defer c.Close()
			nodes, err := c.ClusterNodes(context.Background()).Result()
			return strings.Contains(nodes, "127.0.0.1:"+strconv.Itoa(r.Port)+"@") && strings.Contains(nodes, "slave "+id), err
		})
	}
	return r
}
