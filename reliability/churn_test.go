package reliability

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// connections returns how many connections named name the server has.
func connections(t testing.TB, srv *testenv.RedisServer, name string) int {
	t.Helper()
	return strings.Count(srv.Do("CLIENT", "LIST").(string), " name="+name+" ")
}

// channels returns the channels the server has subscribers on.
func channels(t testing.TB, srv *testenv.RedisServer) []any {
	t.Helper()
	return srv.Do("PUBSUB", "CHANNELS", "*").([]any)
}

// Clients created and closed in a loop, many of them while waiting for a
// lock others hold or while holding one of their own, leave nothing behind:
// no goroutine, no connection, no subscription, and the long-running
// holders keep their locks throughout.
func TestChurn_ClientsComeAndGoWithoutLeaks(t *testing.T) {
	const (
		held     = 3
		churners = 4
		rounds   = 24 // per churner
	)
	srv := testenv.Redis(t)
	defer goleak.VerifyNone(t, append(leakOptions, goleak.IgnoreCurrent())...)
	ctx := context.Background()

	// Long-running holders, renewed by their watchdog throughout.
	holdRDB := redis.NewClient(&redis.Options{Addr: srv.Addr})
	holders := lock.New(holdRDB, lock.WithWatchdogTimeout(600*time.Millisecond), lock.WithLogger(quiet))
	heldCtx := make([]context.Context, held)
	for i := range heldCtx {
		var err error
		if heldCtx[i], err = holders.Mutex(fmt.Sprintf("churn:held-%d", i)).Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := goleak.IgnoreCurrent()

	var wg sync.WaitGroup
	errs := make(chan error, churners*rounds)
	for c := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if err := churnRound(srv.Addr, c, r); err != nil {
					errs <- fmt.Errorf("churner %d round %d: %w", c, r, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if n := connections(t, srv, "churn"); n > 0 {
		t.Logf("%d connections of closed Clients still open on the server right after Close", n)
	}
	for err := range errs {
		t.Error(err)
	}

	if err := goleak.Find(append(leakOptions, snapshot)...); err != nil {
		t.Errorf("goroutines left by closed Clients: %v", err)
	}
	eventually(t, 5*time.Second, "the closed Clients' connections gone from the server", func() bool {
		return connections(t, srv, "churn") == 0
	})
	if chs := channels(t, srv); len(chs) != 0 {
		t.Errorf("subscriptions left on the server: %v", chs)
	}
	for i, hc := range heldCtx {
		if hc.Err() != nil {
			t.Errorf("holder %d lost its lock during the churn: %v", i, context.Cause(hc))
		}
		if n, err := holders.Mutex(fmt.Sprintf("churn:held-%d", i)).HoldCount(hc); err != nil || n != 1 {
			t.Errorf("holder %d: hold count %d, %v", i, n, err)
		}
	}
	for i, hc := range heldCtx {
		if err := holders.Mutex(fmt.Sprintf("churn:held-%d", i)).Unlock(hc); err != nil {
			t.Errorf("holder %d: unlock: %v", i, err)
		}
	}
	holders.Close()
	holdRDB.Close()
}

// churnRound creates a Client, uses it one of four ways and closes it.
func churnRound(addr string, c, r int) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ClientName: "churn"})
	defer rdb.Close()
	locks := lock.New(rdb, lock.WithWatchdogTimeout(600*time.Millisecond), lock.WithLogger(quiet))
	ctx := context.Background()
	busy := locks.Mutex(fmt.Sprintf("churn:held-%d", (c+r)%3))
	own := locks.Mutex(fmt.Sprintf("churn:own-%d-%d", c, r))
	switch r % 4 {
	case 0: // waits for a held lock, gives up
		if _, err := busy.TryLock(ctx, 60*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
			return fmt.Errorf("TryLock of a held lock: %v, want ErrNotAcquired", err)
		}
	case 1: // closed while waiting
		got := make(chan error, 1)
		go func() { _, err := busy.Lock(ctx); got <- err }()
		time.Sleep(30 * time.Millisecond)
		locks.Close()
		select {
		case err := <-got:
			if !errors.Is(err, lock.ErrClosed) {
				return fmt.Errorf("a waiter of a closed Client got %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			return errors.New("a waiter of a closed Client is still waiting")
		}
	case 2: // closed while holding
		hctx, err := own.Lock(ctx)
		if err != nil {
			return err
		}
		locks.Close()
		if !errors.Is(context.Cause(hctx), lock.ErrLost) || !errors.Is(context.Cause(hctx), lock.ErrClosed) {
			return fmt.Errorf("a hold of a closed Client ended with %v, want ErrLost and ErrClosed", context.Cause(hctx))
		}
	case 3: // takes and releases, reentrantly
		hctx, err := own.Lock(ctx)
		if err != nil {
			return err
		}
		inner, err := own.Lock(hctx)
		if err != nil {
			return err
		}
		if err := own.Unlock(inner); err != nil {
			return err
		}
		if err := own.Unlock(hctx); err != nil {
			return err
		}
	}
	return locks.Close()
}
