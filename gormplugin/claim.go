package gormplugin

import (
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/seckillguard/seckillguard/fencing"
)

// ErrNoFence is returned by Claim for a model without a Fence column.
var ErrNoFence = errors.New("gormplugin: model has no fence column")

// Claim raises the fence of the row model names (by its primary key) to the
// token of db's context, changing nothing else. From then on the row refuses
// the writes of every older lock holder, and a read that follows the claim
// sees every older write the row will ever accept.
//
// Fencing orders writes; a claim puts a read among them. Read-modify-write
// code — read the stock, check it, write stock−1 — claims before it reads:
//
//	p := Product{ID: id}
//	if err := gormplugin.Claim(db.WithContext(ctx), &p); err != nil { ... }
//	db.WithContext(ctx).First(&p)
//	db.WithContext(ctx).Model(&p).Update("stock", p.Stock-1)
//
// Without the claim, an older holder that lost its lock could write between
// the newer holder's read and write, be accepted (the newer holder has not
// written yet), and then be overwritten: an update lost although every write
// was fenced. A transaction that reads with SELECT ... FOR UPDATE serialises
// the two holders in the database instead, and needs no claim.
//
// Claim fails with an error matching fencing.ErrStale when a newer holder has
// claimed or written the row, with ErrNoToken when the context carries no
// token, and with ErrNoFence for a model without a Fence column. Claiming a
// row that does not exist is not an error and changes nothing.
func Claim(db *gorm.DB, model any) error {
	if _, ok := fencing.FromContext(db.Statement.Context); !ok {
		return fmt.Errorf("%w: Claim needs a context with a lock's token", ErrNoToken)
	}
	stmt := &gorm.Statement{DB: db}
	if err := stmt.Parse(model); err != nil {
		return fmt.Errorf("gormplugin: claim: %w", err)
	}
	if fenceField(stmt.Schema) == nil {
		return fmt.Errorf("%w: %s", ErrNoFence, stmt.Schema.Table)
	}
	pk := stmt.Schema.PrioritizedPrimaryField
	if pk == nil {
		return fmt.Errorf("gormplugin: claim: %s has no primary key", stmt.Schema.Table)
	}
	// SET pk = pk, fence = token WHERE pk = ? AND fence <= token
	return db.Model(model).UpdateColumn(pk.DBName, clause.Expr{SQL: "?", Vars: []any{clause.Column{Name: pk.DBName}}}).Error
}
