package gormplugin_test

import (
	"context"
	"errors"
	"testing"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
)

func TestBatch_WritesOfEveryPartCommitOnceFencedWithTheBatchToken(t *testing.T) {
	db, _ := open(t)
	p := seed(t, db, "batch-ok", 10, 0)
	b := gormplugin.Batch(db)
	ctx, err := b.Begin(at(7))
	if err != nil {
		t.Fatal(err)
	}
	tx, ok := gormplugin.Tx(ctx)
	if !ok {
		t.Fatal("Tx: no transaction in the batch's context")
	}
	dec := func() error {
		return tx.Model(&Product{}).Where("id = ?", p.ID).Update("stock", gorm.Expr("stock - 1")).Error
	}
	if err := dec(); err != nil {
		t.Fatal(err)
	}
	// The second part is undone to its savepoint; the first stays.
	if err := b.Savepoint(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := dec(); err != nil {
		t.Fatal(err)
	}
	if err := b.RollbackTo(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := b.End(ctx, true); err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 9, 7)
}

func TestBatch_ALostLockRefusesTheCommitAndKeepsNothing(t *testing.T) {
	db, _ := open(t)
	p := seed(t, db, "batch-lost", 10, 0)
	b := gormplugin.Batch(db)
	hold, lose := context.WithCancelCause(at(7))
	ctx, err := b.Begin(hold)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := gormplugin.Tx(ctx)
	if err := tx.Model(&Product{}).Where("id = ?", p.ID).Update("stock", gorm.Expr("stock - 1")).Error; err != nil {
		t.Fatal(err)
	}
	lose(errLost) // the lock is lost before the batch commits
	err = b.End(ctx, true)
	if !errors.Is(err, fencing.ErrStale) || !errors.Is(err, errLost) {
		t.Errorf("commit after the lock was lost: %v; want a stale error caused by the loss", err)
	}
	wantRow(t, db, p.ID, 10, 0)
}
