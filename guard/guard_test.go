package guard_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestGuard_PingFindsAWrongAddressAtBoot: New does no I/O, so a Guard on an
// address where no Redis listens starts fine; Ping, called at boot, says so
// there, with the dial's error, instead of the first requests' 503s.
func TestGuard_PingFindsAWrongAddressAtBoot(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)}), guard.WithLogger(quiet))
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var op *net.OpError
	if err := g.Ping(ctx); err == nil || !errors.As(err, &op) || ctx.Err() != nil {
		t.Errorf("Ping on a closed port: %v (context %v); want the dial's error, before the deadline", err, ctx.Err())
	}

	live := guard.New(testenv.Redis(t).Client(), guard.WithLogger(quiet))
	defer live.Close()
	if err := live.Ping(ctx); err != nil {
		t.Errorf("Ping on a live server: %v", err)
	}
}
