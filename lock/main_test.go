package lock_test

import (
	"os"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestMain starts the redis-servers the package's examples run against and
// points REDIS_ADDR (and, for the RedLock example, REDIS_ADDR2 and
// REDIS_ADDR3) at them; every test starts servers of its own.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithRedis(m, "REDIS_ADDR", "REDIS_ADDR2", "REDIS_ADDR3"))
}
