package lock_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestMain starts the redis-servers the package's examples run against and
// points REDIS_ADDR (and, for the RedLock example, REDIS_ADDR2 and
// REDIS_ADDR3) at them; every test starts servers of its own.
func TestMain(m *testing.M) {
	var servers []*testenv.RedisServer
	var dirs []string
	stop := func() {
		for _, s := range servers {
			s.Kill()
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	for _, env := range []string{"REDIS_ADDR", "REDIS_ADDR2", "REDIS_ADDR3"} {
		dir, err := os.MkdirTemp("", "lock-examples")
		if err == nil {
			dirs = append(dirs, dir)
			var srv *testenv.RedisServer
			if srv, err = testenv.StartRedis(dir); err == nil {
				servers = append(servers, srv)
				os.Setenv(env, srv.Addr)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			stop()
			os.Exit(1)
		}
	}
	code := m.Run()
	stop()
	os.Exit(code)
}
