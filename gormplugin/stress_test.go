package gormplugin_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// TestStress_LostLocksNeverLoseAnUpdate runs 200 goroutines on 4 lock
// Clients, each adding 1 to one balance under a lock whose lease is shorter
// than many of the critical sections: locks ARE lost, holders overlap, and
// only the fence keeps the balance right. Half of the holders even keep
// writing after their lock's context was cancelled (as a paused process
// would, unaware), so the database itself must refuse them.
//
// Each critical section claims the row first (a fenced write that changes
// nothing but the fence), then reads, then writes read+1. After a newer
// holder's claim, an older holder's write is refused; an older write that
// landed before the claim is seen by the newer holder's read. Without the
// claim, an older holder's write between a newer holder's read and write
// would be accepted and then overwritten: fencing orders writes, and the
// claim puts the read among them.
func TestStress_LostLocksNeverLoseAnUpdate(t *testing.T) {
	srv := testenv.Redis(t)
	db, _ := open(t)
	db = db.Session(&gorm.Session{Logger: logger.Discard})
	acct := Account{Balance: 0}
	if err := db.Create(&acct).Error; err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	// Keep every connection: with database/sql's two idle ones, 200
	// goroutines would redial MariaDB for nearly every statement.
	sqlDB.SetMaxOpenConns(32)
	sqlDB.SetMaxIdleConns(32)

	clients := make([]*lock.Client, 4)
	for i := range clients {
		clients[i] = lock.New(srv.Client(), lock.WithLogger(slog.New(slog.DiscardHandler)))
		defer clients[i].Close()
	}
	const goroutines, rounds = 200, 2
	const lease = 25 * time.Millisecond
	var accepted, staleDB, staleCtx, attempts atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := clients[g%len(clients)].Mutex("stress:acct")
			unaware := g%2 == 0
			for r := 0; r < rounds; r++ {
				held, err := m.TryLock(context.Background(), 30*time.Second, lock.WithLease(lease))
				if err != nil {
					t.Error(err)
					return
				}
				ctx := held
				if unaware {
					// Keep the token, drop the cancellation: this holder
					// does not learn that its lease ran out.
					tok, _ := fencing.FromContext(held)
					ctx = fencing.WithToken(context.WithoutCancel(held), tok)
				}
				attempts.Add(1)
				err = func() error {
					tx := db.WithContext(ctx)
					a := Account{ID: acct.ID}
					if err := gormplugin.Claim(tx, &a); err != nil {
						return err
					}
					if err := tx.First(&a, acct.ID).Error; err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // often longer than the lease
					return tx.Model(&a).Update("balance", a.Balance+1).Error
				}()
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, fencing.ErrStale) && unaware:
					staleDB.Add(1)
				case errors.Is(err, fencing.ErrStale), lostBy(held, err):
					staleCtx.Add(1) // refused because the holder's context said the lock was lost
				default:
					t.Errorf("unexpected error: %v", err)
				}
				_ = m.Unlock(held)
			}
		}()
	}
	wg.Wait()
	var final Account
	if err := db.First(&final, acct.ID).Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d attempts: %d accepted, %d refused by the database fence, %d refused because the lock context was cancelled",
		attempts.Load(), accepted.Load(), staleDB.Load(), staleCtx.Load())
	if int64(final.Balance) != accepted.Load() {
		t.Fatalf("balance %d but %d writes were accepted: updates were lost", final.Balance, accepted.Load())
	}
	if accepted.Load()+staleDB.Load()+staleCtx.Load() != attempts.Load() {
		t.Fatalf("not every write was accounted for")
	}
	if staleDB.Load() == 0 || staleCtx.Load() == 0 {
		t.Fatalf("locks were never lost (db %d, ctx %d): the test did not test anything", staleDB.Load(), staleCtx.Load())
	}
}

// lostBy reports whether err came from the end of held, the context of a
// lock that was lost: a read cut short at the lease's end. The driver's
// network deadline can fire before the context's own timer, so a deadline
// already past counts once the context says why.
func lostBy(held context.Context, err error) bool {
	if d, ok := held.Deadline(); ok && !time.Now().Before(d) {
		<-held.Done()
	}
	return err != nil && held.Err() != nil && errors.Is(context.Cause(held), lock.ErrLost)
}
