package lock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// failReleases fails the next n release calls before they are sent.
type failReleases struct{ n atomic.Int32 }

func (h *failReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 4 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			if k, _ := args[4].(string); strings.HasPrefix(k, channelPrefix) && h.n.Add(-1) >= 0 {
				err := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("broken pipe (injected)")}
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A hold whose final release succeeds in the background (after its Unlock
// failed and let go of it) is forgotten too: network blips leave nothing
// behind in the Client.
func TestHold_ReleasedInTheBackgroundIsForgotten(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	hook := new(failReleases)
	hook.n.Store(1)
	rdb.AddHook(hook)
	c := New(rdb, WithWatchdogTimeout(time.Second))
	defer c.Close()
	m := c.Mutex("internal:forgotten")
	ctx, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err == nil {
		t.Fatal("the failing unlock succeeded")
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := c.holds.size()
		if n == 0 && ctx.Err() != nil {
			if locked, _ := m.IsLocked(context.Background()); locked {
				t.Fatal("released in the background, yet still locked")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d holds still registered after the background release", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
