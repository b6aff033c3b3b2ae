package reliability

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// A Client hands a Mutex from holder to waiter without asking Redis for a
// token: each handed-over hold takes the next token of the block its run
// reserved. The reservation moves Redis's counter past the block, so the
// next acquisition by another Client — which gets max(counter+1, Redis
// TIME) — is above every handed-over token even when the counter, not the
// clock, decides: after a failover to a master whose clock is behind, or a
// clock stepped back. Here the counter is raised far past the clock, so
// tokens follow it alone, and a run of handovers is followed by another
// Client's acquisition: tokens strictly increase across both.
func TestHandover_ReservedTokensStayBelowTheNextClientsWhenTheClockIsBehind(t *testing.T) {
	srv := testenv.Redis(t)
	const name = "sku:reserve"
	// A counter far ahead of Redis TIME (microseconds): 2^52.
	srv.Do("SET", "redisson_lock_token:{"+name+"}", int64(1)<<52)
	a := lockClient(t, srv.Addr, nil)
	b := lockClient(t, srv.Addr, nil)
	ma := a.Mutex(name)

	// Waiters of the same Client queue behind the holder (they subscribe
	// to the lock's channel once they found the lock held), and each Unlock
	// hands the lock to the next: their tokens are then the next ones of
	// the holder's block. A waiter that was not queued in time takes the
	// lock from Redis instead; the round is run again.
	const waiters = 3
	var first, prev fencing.Token
	var run []fencing.Token
	handedOver := func() bool {
		for i, tok := range run {
			if tok != first+fencing.Token(i+1) {
				return false
			}
		}
		return len(run) == waiters
	}
	for round := 0; !handedOver(); round++ {
		if round == 30 {
			t.Fatalf("no run of %d handovers in %d rounds (last: holder %d, waiters %v), so this test shows nothing", waiters, round, first, run)
		}
		held, err := ma.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		first, _ = fencing.FromContext(held)
		if first <= prev || first <= 1<<52 {
			t.Fatalf("token %d after %d, with the counter raised to 2^52", first, prev)
		}
		got := make(chan fencing.Token, waiters)
		var wg sync.WaitGroup
		for range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, err := ma.Lock(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				tok, _ := fencing.FromContext(ctx)
				got <- tok
				_ = ma.Unlock(ctx)
			}()
		}
		eventually(t, 5*time.Second, "the waiters subscribed", func() bool {
			v := srv.Do("PUBSUB", "NUMSUB", "redisson_lock__channel:{"+name+"}").([]any)
			return v[1].(int64) > 0
		})
		if err := ma.Unlock(held); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(got)
		run = run[:0]
		prev = first
		for tok := range got { // in the order they held the lock
			if tok <= prev {
				t.Fatalf("token %d after %d in one run of handovers", tok, prev)
			}
			run, prev = append(run, tok), tok
		}
	}
	ctx, err := b.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	next, _ := fencing.FromContext(ctx)
	t.Logf("first %d, handed over %v, other Client %d", first, run, next)
	if next <= prev {
		t.Fatalf("another Client's token %d is not above the handed-over %d: two holders carry one token, and the fence cannot tell them apart", next, prev)
	}
	_ = b.Mutex(name).Unlock(ctx)
}
