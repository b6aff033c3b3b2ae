package guard_test

import (
	"os"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestMain starts the redis-server the package's examples run against and
// points REDIS_ADDR at it; every test starts servers of its own.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithRedis(m, "REDIS_ADDR"))
}
