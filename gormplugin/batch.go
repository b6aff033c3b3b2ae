package gormplugin

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// Batch is the shared transaction of the requests of one batch on a
// combining route (guard.Combining): it implements guard.Session with one
// transaction per batch, begun under the lock's context (so every write of
// the batch is fenced with the lock's token, and the transaction is rolled
// back by database/sql the moment the lock is lost), a savepoint before
// each request's part, and one COMMIT, judged as Transaction judges it.
//
//	r.POST("/buy/:sku", g.Lock("sku:<sku>", guard.Combining(gormplugin.Batch(db))), buy)
//
// A handler of the route finds the transaction with Tx.
func Batch(db *gorm.DB) *Batches {
	if db == nil {
		panic("gormplugin: Batch(nil)")
	}
	return &Batches{db: db}
}

// Batches is the guard.Session of a database; see Batch.
type Batches struct{ db *gorm.DB }

type batchKey struct{}

// Begin starts the batch's transaction under ctx, the lock's context.
func (b *Batches) Begin(ctx context.Context) (context.Context, error) {
	tx := b.db.WithContext(ctx).Begin()
	if err := tx.Error; err != nil {
		if token, ok := fencing.FromContext(ctx); ok && ctxend.Ended(fencing.Holder(ctx)) {
			return ctx, refusedIn(fencing.Holder(ctx), "", token)
		}
		return ctx, err
	}
	return context.WithValue(ctx, batchKey{}, tx), nil
}

// Savepoint marks where the next request's part begins.
func (b *Batches) Savepoint(ctx context.Context, name string) error {
	tx, err := batchTx(ctx)
	if err != nil {
		return err
	}
	return tx.SavePoint(name).Error
}

// RollbackTo undoes the work since the savepoint name.
func (b *Batches) RollbackTo(ctx context.Context, name string) error {
	tx, err := batchTx(ctx)
	if err != nil {
		return err
	}
	return tx.RollbackTo(name).Error
}

// End commits the batch's transaction (commit true) or rolls it back. A
// COMMIT whose answer was lost is ErrOutcomeUnknown; one that database/sql
// refused to send because the lock's context ended is stale.
func (b *Batches) End(ctx context.Context, commit bool) error {
	tx, err := batchTx(ctx)
	if err != nil {
		return err
	}
	if !commit {
		err := tx.Rollback().Error
		if errors.Is(err, gorm.ErrInvalidTransaction) || ctxend.Ended(ctx) {
			return nil // already rolled back: the lock's context ended
		}
		return err
	}
	if err := tx.Commit().Error; err != nil {
		return commitError(tx.Statement.Context, "", err)
	}
	return nil
}

// Tx returns the transaction of the batch that ctx, a request context on a
// combining route, runs in, and false outside a batch. ctx may be the
// request's context (c.Request.Context()) or, in the Gin idiom, the
// *gin.Context itself: a context that does not carry the batch but a lock
// context under fencing.ContextKey (which a *gin.Context answers from its
// keys, whatever its ContextWithFallback) gives that context's batch. Its
// statements run in the batch's context, which carries the lock's token and
// ends only with the lock: a request whose client goes away during its turn
// cannot break the transaction of the others. The handler checks its own
// request context where it wants to stop early.
func Tx(ctx context.Context) (*gorm.DB, bool) {
	if tx, ok := ctx.Value(batchKey{}).(*gorm.DB); ok {
		return tx, true
	}
	if inner, ok := ctx.Value(fencing.ContextKey).(context.Context); ok && inner != nil {
		tx, ok := inner.Value(batchKey{}).(*gorm.DB)
		return tx, ok
	}
	return nil, false
}

var errNoBatch = errors.New("gormplugin: the context belongs to no batch (guard.Combining with gormplugin.Batch)")

func batchTx(ctx context.Context) (*gorm.DB, error) {
	if tx, ok := Tx(ctx); ok {
		return tx, nil
	}
	return nil, errNoBatch
}
