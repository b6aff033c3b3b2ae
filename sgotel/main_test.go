package sgotel_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestMain starts the redis-server the package's tests and examples run
// against and points REDIS_ADDR at it, unless REDIS_ADDR names one already;
// every test keeps its keys under a prefix of its own either way.
func TestMain(m *testing.M) {
	if os.Getenv("REDIS_ADDR") != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "sgotel-tests")
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
