package guard

import (
	"context"
	_ "embed"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/lock"
)

var (
	//go:embed scripts/idem_renew.lua
	renewSource string
	renewScript = redis.NewScript(renewSource)
)

// A keeper renews the in-progress markers of the idempotent requests its
// Guard runs, the way the lock watchdog renews locks: one timer for all of
// them, armed for the earliest renewal due. A request that ends within a
// third of its lease — nearly all of them — is never renewed and costs no
// Redis command here; the others are renewed together, in one pipeline per
// round, every third of their lease. A marker found gone or taken over, or
// not renewed before its lease ends (Redis unreachable), cancels its
// request's context with cause lock.ErrLost: its answer is then not stored,
// and the handler learns that a retry may run meanwhile.
type keeper struct {
	rdb redis.UniversalClient
	log *slog.Logger

	rounds sync.Mutex // one round at a time: an inFlight's times are the rounds' own

	mu     sync.Mutex
	live   map[*inFlight]struct{}
	timer  *time.Timer // nil until the first marker; armed for armed
	armed  time.Time   // when the timer fires; zero when it is not armed
	closed bool
}

// An inFlight is the in-progress marker of one running request.
type inFlight struct {
	ctx         context.Context // the request's, for the log
	key, marker string
	lease       time.Duration
	until       time.Time // its lease ends, by this process's clock (measured from before the call that set it)
	next        time.Time // its next renewal is due
	cancel      context.CancelCauseFunc
}

func newKeeper(rdb redis.UniversalClient, log *slog.Logger) *keeper {
	return &keeper{rdb: rdb, log: log, live: make(map[*inFlight]struct{})}
}

// keep starts renewing the marker of key, set at sent with lease, for the
// request of ctx; cancel ends the request's context when the marker is
// lost. Stop it with drop.
func (k *keeper) keep(ctx context.Context, key, marker string, lease time.Duration, sent time.Time, cancel context.CancelCauseFunc) *inFlight {
	f := &inFlight{ctx: ctx, key: key, marker: marker, lease: lease, until: sent.Add(lease), next: sent.Add(lease / 3), cancel: cancel}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		cancel(lock.ErrClosed)
		return f
	}
	k.live[f] = struct{}{}
	k.armLocked(f.next)
	return f
}

// drop stops renewing f.
func (k *keeper) drop(f *inFlight) {
	k.mu.Lock()
	delete(k.live, f)
	k.mu.Unlock()
}

// armLocked makes the timer fire at t at the latest.
func (k *keeper) armLocked(t time.Time) {
	if !k.armed.IsZero() && !k.armed.After(t) {
		return
	}
	k.armed = t
	d := time.Until(t)
	if k.timer == nil {
		k.timer = time.AfterFunc(d, k.round)
		return
	}
	k.timer.Reset(d)
}

// round renews the markers that are due, cancels the lost ones and arms the
// timer for the next renewal due.
func (k *keeper) round() {
	k.rounds.Lock()
	defer k.rounds.Unlock()
	now := time.Now()
	k.mu.Lock()
	k.armed = time.Time{}
	if k.closed {
		k.mu.Unlock()
		return
	}
	var due []*inFlight
	for f := range k.live {
		if !f.next.After(now) {
			due = append(due, f)
		}
	}
	k.mu.Unlock()

	if len(due) > 0 {
		sent, cmds := k.renew(due)
		for i, f := range due {
			var n int64
			err := errors.New("no answer")
			if i < len(cmds) {
				n, err = cmds[i].(*redis.Cmd).Int64()
			}
			switch {
			case err == nil && n == 1:
				f.until, f.next = sent.Add(f.lease), sent.Add(f.lease/3)
			case err == nil:
				k.lose(f, "the in-progress marker is gone or another execution's")
			case !time.Now().Before(f.until):
				k.log.WarnContext(f.ctx, "guard: renewing an idempotency key failed until its lease ended", "err", err)
				k.lose(f, "its lease ended without a renewal")
			default:
				// Try again soon, well before the lease ends.
				f.next = time.Now().Add(min(f.lease/10, time.Until(f.until)))
			}
		}
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	var first time.Time
	for f := range k.live {
		if first.IsZero() || f.next.Before(first) {
			first = f.next
		}
	}
	if !first.IsZero() && !k.closed {
		k.armLocked(first)
	}
}

// renew sends one renewal per marker of due, in one pipeline, and returns
// when it was sent and the answers.
func (k *keeper) renew(due []*inFlight) (time.Time, []redis.Cmder) {
	ctx := context.Background()
	send := func() (time.Time, []redis.Cmder) {
		sent := time.Now()
		cmds, _ := k.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, f := range due {
				renewScript.EvalSha(ctx, p, []string{f.key}, f.marker, f.lease.Milliseconds())
			}
			return nil
		})
		return sent, cmds
	}
	sent, cmds := send()
	for _, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// The server does not know the script yet (or lost it in a
			// restart): load it and send the round again.
			if renewScript.Load(ctx, k.rdb).Err() == nil {
				return send()
			}
			break
		}
	}
	return sent, cmds
}

// lose ends f's request: its key may be another execution's by now.
func (k *keeper) lose(f *inFlight, why string) {
	k.drop(f)
	f.cancel(&keyLostError{why: why})
}

// close stops the keeper: running requests are no longer renewed, and their
// markers expire with their leases.
func (k *keeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	if k.timer != nil {
		k.timer.Stop()
	}
}

// keyLostError is the cause of a request context cancelled because its
// idempotency key's in-progress marker was lost; it matches lock.ErrLost.
type keyLostError struct{ why string }

func (e *keyLostError) Error() string {
	return "guard: idempotency key no longer held: " + e.why
}

func (e *keyLostError) Unwrap() error { return lock.ErrLost }
