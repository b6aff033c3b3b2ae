package main

import (
	"context"
	"net/http"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
)

// Mode guard-combine: the purchase route of the policy file combines its
// requests (guard.Combining). While one purchase of an instance holds a
// SKU's lock, the purchases of that instance arriving for the same SKU wait
// behind it in the process; the holder runs them in one transaction of
// gormplugin.Batch, each in a savepoint of its own, and commits once for
// all of them. The lock is still taken per SKU, once per batch, so the
// instances still take turns, and every write of the batch carries the
// hold's token.
//
// The purchase itself (buy) is the same in every guarded mode: it reads
// the row with SELECT ... FOR UPDATE, checks the stock, deducts it and
// creates the order in one transaction — here the batch's, in which the row
// lock is taken once and kept until the batch commits. A repeat buyer's
// part is rolled back to its savepoint (its unit given back) while the rest
// of the batch buys; a lost lock refuses the whole batch and every purchase
// of it is answered 409.

// combining returns the policies with the purchase route combining on db.
func combining(pol *guard.Policies, db *gorm.DB) (*guard.Policies, error) {
	return pol.With(http.MethodPost+" "+routeBuy, guard.Combining(gormplugin.Batch(db)))
}

// transaction runs fc in the purchase's transaction: in mode guard-combine
// the batch's, after this purchase's savepoint (its commit is the batch's);
// else a transaction of its own, gormplugin.Transaction rather than
// db.Transaction, so that a COMMIT whose answer was lost is reported as
// such, not as a driver error (or, with the lock lost meanwhile, as a
// refusal).
func (s *Service) transaction(ctx context.Context, db *gorm.DB, fc func(tx *gorm.DB) error) error {
	if tx, ok := gormplugin.Tx(ctx); ok {
		return fc(tx)
	}
	return gormplugin.Transaction(db, fc)
}
