package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// TestScripts_AServerThatLostItsScriptsRunsThemAgain: after SCRIPT FLUSH
// (a restart, a failover, an operator) every script call still gets
// through: a single call is sent again whole with EVAL, and the
// watchdog's pipelined renewals load their script and are sent again, so
// a held lock is neither lost nor left unreleased.
func TestScripts_AServerThatLostItsScriptsRunsThemAgain(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(300*time.Millisecond))[0]
	m := c.Mutex(lockName(t))
	bg := context.Background()

	srv.Do("SCRIPT", "FLUSH")
	held, err := m.Lock(bg)
	if err != nil {
		t.Fatalf("Lock after SCRIPT FLUSH: %v", err)
	}
	srv.Do("SCRIPT", "FLUSH")
	time.Sleep(time.Second) // three renewal periods and more than the lease
	if err := held.Err(); err != nil {
		t.Fatalf("the hold ended after SCRIPT FLUSH: %v", context.Cause(held))
	}
	srv.Do("SCRIPT", "FLUSH")
	if err := m.Unlock(held); err != nil {
		t.Fatalf("Unlock after SCRIPT FLUSH: %v", err)
	}
	if locked, err := m.IsLocked(bg); err != nil || locked {
		t.Fatalf("IsLocked after the Unlock = %v, %v; want false", locked, err)
	}
}
