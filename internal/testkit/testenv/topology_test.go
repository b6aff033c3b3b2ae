package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestCluster_StartsThreeMastersCoveringEverySlot(t *testing.T) {
	start := time.Now()
	e := Cluster(t, 3)
	c := e.Client()
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	masters := make(map[string]bool)
	for i := 0; i < 20; i++ {
		n, err := c.MasterForKey(ctx, fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		masters[n.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("keys landed on %d masters, want 3", len(masters))
	}
	t.Logf("cluster up in %v", time.Since(start))
}

func TestSentinel_FailsOverWhenTheMasterDies(t *testing.T) {
	start := time.Now()
	e := Sentinel(t)
	t.Logf("sentinels ready in %v", time.Since(start))
	c := e.FailoverClient()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	e.Master.Do("WAIT", 1, 1000)
	killed := time.Now()
	e.Master.Kill()
	e.WaitForFailover(20 * time.Second)
	t.Logf("failed over in %v", time.Since(killed))
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("after failover: %q, %v", v, err)
	}
}
