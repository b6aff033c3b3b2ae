package guard_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestMain starts the redis-server the package's examples run against and
// points REDIS_ADDR at it; every test starts servers of its own.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "guard-examples")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv, err := testenv.StartRedis(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("REDIS_ADDR", srv.Addr)
	code := m.Run()
	srv.Kill()
	os.RemoveAll(dir)
	os.Exit(code)
}
