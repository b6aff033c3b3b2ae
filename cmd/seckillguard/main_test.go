package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// javaField is the owner field a Java service on Redisson writes: its
// connection manager id and the thread id.
const javaField = "7c2f0a6e-0d3b-4f3e-9a55-3b1d2f9b8e11:57"

// cli runs the command with REDIS_URL pointing at srv.
func cli(t *testing.T, srv *testenv.RedisServer, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, func(k string) string {
		if k == "REDIS_URL" {
			return "redis://" + srv.Addr
		}
		return ""
	}, &out, &errOut)
	return out.String(), err
}

// wantFits fails for every line of out wider than 80 columns.
func wantFits(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line of %d columns: %q", n, line)
		}
	}
}

// TestInspect_RedissonLockHeldTwice: the stuck lock of a Java service, a
// thread that took it twice and unlocked once, is shown with its thread and
// hold count, in text and in JSON.
func TestInspect_RedissonLockHeldTwice(t *testing.T) {
	srv := testenv.Redis(t)
	srv.Do("HSET", "sku:42", javaField, 2)
	srv.Do("PEXPIRE", "sku:42", 30000)

	out, err := cli(t, srv, "inspect", "sku:42")
	if err != nil {
		t.Fatal(err)
	}
	wantFits(t, out)
	for _, want := range []string{"lock sku:42", "held (mutex)", javaField + "  holds 2", "fencing counter: none", "nobody subscribed"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect prints no %q:\n%s", want, out)
		}
	}

	// -json wherever it stands: before the command, after it, after the name.
	for _, args := range [][]string{{"inspect", "-json", "sku:42"}, {"-json", "inspect", "sku:42"}, {"inspect", "sku:42", "-json"}} {
		out, err = cli(t, srv, args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		var r lockReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, out)
		}
		if !r.Held || r.Kind != "mutex" || len(r.Owners) != 1 || r.Owners[0].OwnerID != "57" || r.Owners[0].Holds != 2 || r.LeaseMs <= 29000 {
			t.Errorf("%q: %+v", args, r)
		}
	}
}

// TestInspect_AFairLineShowsEachWaitersSide: a FairMutex line shared with
// Redisson shows which waiter is a foreign (Java) one and which is ours, with
// their deadlines, in text and in JSON.
func TestInspect_AFairLineShowsEachWaitersSide(t *testing.T) {
	srv := testenv.Redis(t)
	ours := "5e1d0c3a-8b2f-4c7d-9e6a-1f2b3c4d5e6f:12345"
	now := time.Now().UnixMilli()
	srv.Do("HSET", "sku:42", javaField, 1)
	srv.Do("PEXPIRE", "sku:42", 30000)
	srv.Do("RPUSH", "redisson_lock_queue:{sku:42}", javaField, ours)
	srv.Do("ZADD", "redisson_lock_timeout:{sku:42}", now+330000, javaField, now+630000, ours)
	srv.Do("ZADD", "seckillguard_fair_alive:{sku:42}", now+30000, ours)
	srv.Do("HSET", "seckillguard_fair_wait:{sku:42}", ours, 300000)

	out, err := cli(t, srv, "inspect", "sku:42")
	if err != nil {
		t.Fatal(err)
	}
	wantFits(t, out)
	for _, want := range []string{"fair line: 2", "1. " + javaField + "  foreign", "2. " + ours + "  ours", "liveness "} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect prints no %q:\n%s", want, out)
		}
	}
	out, err = cli(t, srv, "inspect", "-json", "sku:42")
	if err != nil {
		t.Fatal(err)
	}
	var r lockReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(r.Queue) != 2 || r.Queue[0].Side != "foreign" || r.Queue[1].Side != "ours" || r.Queue[0].DeadlineMs < 300000 || r.Queue[1].ExpiresMs > 30000 {
		t.Fatalf("fair line %+v", r.Queue)
	}
}

// TestInspect_LockOfAHolderProcess: a lock held by another process (the
// fault suite's holder, a Go service taking sku locks) shows its owner, a
// fencing token, and the waiting Client of this process.
func TestInspect_LockOfAHolderProcess(t *testing.T) {
	bin := faults.Build(t, faults.HolderPackage)
	srv := testenv.Redis(t)
	dsn := testenv.MySQL(t)
	db, err := faults.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := faults.SeedRegisters(db, "reg"); err != nil {
		t.Fatal(err)
	}
	h := faults.StartHolder(t, bin, "h", srv.Addr, dsn, faults.HolderOptions{Watchdog: 3 * time.Second})
	locked := h.Lock("reg", 10*time.Second)

	waiter := lock.New(srv.Client())
	defer waiter.Close()
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		waiter.Mutex("reg").Lock(wctx)
	}()
	var r lockReport
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := cli(t, srv, "inspect", "-json", "reg")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Channels) > 0 && r.Channels[0].Subscribers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting Client never showed as subscribed: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(r.Owners) != 1 || r.Owners[0].ClientID == waiter.ID() || r.Owners[0].Holds != 1 {
		t.Errorf("owners %+v, want the holder process once", r.Owners)
	}
	if r.Token < locked.Token || r.LeaseMs <= 0 || r.LeaseMs > 3000 {
		t.Errorf("token %d (the holder's: %d), lease %dms (its watchdog: 3s)", r.Token, locked.Token, r.LeaseMs)
	}
	out, err := cli(t, srv, "inspect", "reg")
	if err != nil {
		t.Fatal(err)
	}
	wantFits(t, out)
	if !strings.Contains(out, "redisson_lock__channel:{reg}  1") {
		t.Errorf("inspect does not show the waiting client:\n%s", out)
	}
	cancel()
	<-done
	h.Unlock("reg")
}

// TestList_ShowsLocksNotTheirCounters lists the locks matching a pattern,
// one line each, leaving out token counters and keys that are no locks.
func TestList_ShowsLocksNotTheirCounters(t *testing.T) {
	srv := testenv.Redis(t)
	locks := lock.New(srv.Client())
	defer locks.Close()
	held, err := locks.Mutex("sku:1").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Mutex("sku:1").Unlock(held)
	srv.Do("HSET", "sku:2", javaField, 1)
	srv.Do("PEXPIRE", "sku:2", 30000)
	srv.Do("SET", "sku:3", "not a lock")
	srv.Do("HSET", "order:1", javaField, 1)

	out, err := cli(t, srv, "list", "sku:*")
	if err != nil {
		t.Fatal(err)
	}
	wantFits(t, out)
	if !strings.Contains(out, "sku:1 ") || !strings.Contains(out, "sku:2 ") || strings.Contains(out, "sku:3") || strings.Contains(out, "order:1") || strings.Contains(out, "redisson_lock_token") {
		t.Errorf("list sku:* =\n%s", out)
	}
	out, err = cli(t, srv, "list", "-json", "-limit", "1", "sku:*")
	if err != nil {
		t.Fatal(err)
	}
	var rs []lockReport
	if err := json.Unmarshal([]byte(out), &rs); err != nil || len(rs) != 1 {
		t.Errorf("list -json -limit 1: %v\n%s", err, out)
	}
}

// TestForceUnlock_NeedsYesAndSaysWhatItRemoved: without -yes nothing is
// touched; with it the lock is deleted, what it held is printed, and a
// waiter gets the lock.
func TestForceUnlock_NeedsYesAndSaysWhatItRemoved(t *testing.T) {
	srv := testenv.Redis(t)
	srv.Do("HSET", "sku:7", javaField, 3)
	srv.Do("PEXPIRE", "sku:7", 60000)

	if _, err := cli(t, srv, "force-unlock", "sku:7"); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-yes") {
		t.Errorf("force-unlock without -yes: %v, want a usage error naming -yes", err)
	}
	if srv.Do("EXISTS", "sku:7") != int64(1) {
		t.Fatal("force-unlock without -yes removed the lock")
	}

	waiter := lock.New(srv.Client())
	defer waiter.Close()
	got := make(chan error, 1)
	go func() {
		ctx, err := waiter.Mutex("sku:7").Lock(context.Background())
		if err == nil {
			err = waiter.Mutex("sku:7").Unlock(ctx)
		}
		got <- err
	}()
	out, err := cli(t, srv, "-yes", "force-unlock", "sku:7")
	if err != nil {
		t.Fatal(err)
	}
	wantFits(t, out)
	if !strings.Contains(out, "removed sku:7") || !strings.Contains(out, javaField+"  holds 3") {
		t.Errorf("force-unlock printed:\n%s", out)
	}
	if !regexp.MustCompile(`its lease [0-9.]+m?s left, held by`).MatchString(out) || strings.Contains(out, "left left") {
		t.Errorf("force-unlock does not say once what was left of the lease:\n%s", out)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the waiter did not get the lock within 10s of the forced unlock (its lease had 60s left)")
	}
	if out, err := cli(t, srv, "force-unlock", "-yes", "sku:7"); err != nil || !strings.Contains(out, "not held") {
		t.Errorf("force-unlock of a free lock: %v\n%s", err, out)
	}
}

// TestRun_RefusesNonsense: no command, no argument, an unknown command or
// flag, a flag of another command. Each is a usage error that run returns
// without printing it.
func TestRun_RefusesNonsense(t *testing.T) {
	none := func(string) string { return "" }
	for _, args := range [][]string{
		{}, {"inspect"}, {"inspect", "a", "b"}, {"unlock", "x"}, {"--bogus"}, {"inspect", "--bogus", "x"},
		{"inspect", "-limit", "5", "x"}, {"inspect", "-yes", "x"}, {"list", "-limit", "0", "x"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, none, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
		if errOut.Len() > 0 {
			t.Errorf("%q: run printed on stderr: %q", args, errOut.String())
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, none, &out, &out); err != nil || !strings.Contains(out.String(), "force-unlock") {
		t.Errorf("help: %v\n%s", err, out.String())
	}
	wantFits(t, out.String())
}

// TestCLI_PrintsAnErrorOnce: an unknown flag is named once on stderr, with
// where to look, and the exit code is 2; -h prints the usage and is no
// error.
func TestCLI_PrintsAnErrorOnce(t *testing.T) {
	none := func(string) string { return "" }
	for _, args := range [][]string{{"--bogus"}, {"inspect", "--bogus", "x"}, {"-bogus", "list", "*"}} {
		var out, errOut bytes.Buffer
		if code := execute(context.Background(), args, none, &out, &errOut); code != 2 {
			t.Errorf("%q: exit code %d, want 2", args, code)
		}
		if n := strings.Count(errOut.String(), "-bogus"); n != 1 {
			t.Errorf("%q: stderr names -bogus %d times, want once:\n%s", args, n, errOut.String())
		}
		if !strings.Contains(errOut.String(), "seckillguard help") {
			t.Errorf("%q: stderr does not say where the flags are listed:\n%s", args, errOut.String())
		}
	}
	for _, args := range [][]string{{"-h"}, {"inspect", "-h"}, {"--help"}} {
		var out, errOut bytes.Buffer
		if code := execute(context.Background(), args, none, &out, &errOut); code != 0 || !strings.Contains(out.String(), "commands:") || errOut.Len() > 0 {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 0 and the usage on stdout", args, code, out.String(), errOut.String())
		}
	}
}

// TestConnect_DefaultsToRedisCLIsServer: with REDIS_URL unset the command
// talks to 127.0.0.1:6379, database 0, as redis-cli does.
func TestConnect_DefaultsToRedisCLIsServer(t *testing.T) {
	rdb, err := connect("", false)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	c, ok := rdb.(*redis.Client)
	if !ok {
		t.Fatalf("connect(\"\") = %T, want a single-node client", rdb)
	}
	if o := c.Options(); o.Addr != "127.0.0.1:6379" || o.DB != 0 {
		t.Errorf("default Redis %s db %d, want 127.0.0.1:6379 db 0", o.Addr, o.DB)
	}
}

// TestInspect_TheFullKeyOfALogLine: a lock of a Client with a namespace is
// found by the full key its log lines show, without -namespace, and by its
// name with -namespace; the full key given with -namespace too is said to
// carry the namespace twice.
func TestInspect_TheFullKeyOfALogLine(t *testing.T) {
	srv := testenv.Redis(t)
	locks := lock.New(srv.Client(), lock.WithNamespace("shop"))
	defer locks.Close()
	m := locks.Mutex("sku:42")
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(held)
	for _, args := range [][]string{{"inspect", locks.Key("sku:42")}, {"inspect", "-namespace", "shop", "sku:42"}} {
		out, err := cli(t, srv, args...)
		if err != nil || !strings.Contains(out, "held (mutex)") {
			t.Errorf("%v: %v\n%s; want the lock held", args, err, out)
		}
	}
	out, err := cli(t, srv, "inspect", "-namespace", "shop", "shop:sku:42")
	if err != nil || !strings.Contains(out, "free") || !strings.Contains(out, "leave -namespace out") {
		t.Errorf("the full key with -namespace: %v\n%s; want free, and a word about the namespace given twice", err, out)
	}
	wantFits(t, out)
}
