package sgotel_test

import (
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
	os.Exit(testenv.RunWithRedis(m, "REDIS_ADDR"))
}
