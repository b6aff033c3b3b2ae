package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// TestDocs_TheInspectorSampleIsWhatItPrints: the session docs/OBSERVABILITY.md
// shows (inspect, list, force-unlock of a lock held twice by one Client while
// another waits) is what the command prints today, up to the ids, tokens and
// durations of a run: a sample of an older output (a counter shown
// "(no expiry)", other columns) fails.
func TestDocs_TheInspectorSampleIsWhatItPrints(t *testing.T) {
	srv := testenv.Redis(t)
	holder, waiter := lock.New(srv.Client()), lock.New(srv.Client())
	defer holder.Close()
	defer waiter.Close()
	m := holder.Mutex("sku:42")
	ctx, err := m.Lock(context.Background())
	if err == nil {
		ctx, err = m.Lock(ctx) // held twice
	}
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go waiter.Mutex("sku:42").TryLock(wctx, time.Minute)
	rdb := srv.Client()
	for deadline := time.Now().Add(10 * time.Second); rdb.PubSubNumSub(context.Background(), "redisson_lock__channel:{sku:42}").Val()["redisson_lock__channel:{sku:42}"] != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the waiting Client never subscribed")
		}
		time.Sleep(10 * time.Millisecond)
	}

	var session strings.Builder
	for _, args := range [][]string{{"inspect", "sku:42"}, {"list", "sku:*"}, {"force-unlock", "-yes", "sku:42"}} {
		out, err := cli(t, srv, args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		shown := strings.Join(args, " ")
		if args[0] == "list" {
			shown = "list 'sku:*'"
		}
		session.WriteString("$ seckillguard " + shown + "\n" + out)
	}

	doc, err := os.ReadFile("../../docs/OBSERVABILITY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sample, ok := strings.Cut(string(doc), "```\n$ seckillguard inspect sku:42\n")
	if !ok {
		t.Fatal("docs/OBSERVABILITY.md shows no session that starts with `$ seckillguard inspect sku:42`")
	}
	sample, _, _ = strings.Cut("$ seckillguard inspect sku:42\n"+sample, "```")
	if got, want := sampleShape(session.String()), sampleShape(sample); got != want {
		t.Errorf("docs/OBSERVABILITY.md's inspector session is not what the command prints; it prints:\n%s\nin the shape\n%s\nthe sample's shape:\n%s",
			session.String(), got, want)
	}
}

// sampleShape replaces what differs from run to run in the inspector's
// output (Client ids, owner ids, tokens, durations, column padding) with
// placeholders.
func sampleShape(s string) string {
	for _, r := range []struct{ re, with string }{
		{`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:\d+`, "ID:N"},
		{`\b\d{13,}\b`, "TOKEN"},
		{`\b(\d+h)?(\d+m)?\d+(\.\d+)?(s|ms)\b`, "DURATION"},
		{` +`, " "},
	} {
		s = regexp.MustCompile(r.re).ReplaceAllString(s, r.with)
	}
	return strings.TrimSpace(s)
}
