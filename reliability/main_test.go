// Package reliability is the fault, pause and hostile-input suite of
// seckillguard. It has no API: its tests run the failures a Redis lock
// meets in production — a holder frozen past its lease, Redis restarted empty, a slow
// and lossy network, a Sentinel failover, a service instance paused mid-sale,
// clients churning — and hostile requests, against real redis-server,
// Sentinel and MariaDB processes, and check the recorded histories with
// package internal/testkit/history. docs/RELIABILITY.md maps each guarantee to the
// test that shows it.
package reliability

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
)

// binDir holds the binaries the suite builds once per run.
var binDir string

// silentRedis drops go-redis's own log lines (dial failures during a
// failover, reconnects): the scenarios provoke them on purpose.
type silentRedis struct{}

func (silentRedis) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	redis.SetLogger(silentRedis{})
	dir, err := os.MkdirTemp("", "reliability-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var builds sync.Map // import path → func() (string, error)

// binary builds the main package pkg once per run and returns its path.
func binary(t testing.TB, pkg string) string {
	t.Helper()
	f, _ := builds.LoadOrStore(pkg, sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp(binDir, "")
		if err != nil {
			return "", err
		}
		return faults.BuildIn(dir, pkg)
	}))
	bin, err := f.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
