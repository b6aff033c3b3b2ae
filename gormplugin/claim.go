package gormplugin

import (
	"errors"
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"

	"github.com/seckillguard/seckillguard/fencing"
)

// ErrNoFence is returned by Claim for a model without a Fence column.
var ErrNoFence = errors.New("gormplugin: model has no fence column")

// Claim raises the fence of the row model names to the token of db's
// context, changing nothing else. The row is named by the conditions db
// carries (Claim(db.Where("sku = ?", sku), &Product{})), else by the
// model's primary key, else by the first unique key whose fields are all
// set in the model (Claim(db, &Product{SKU: sku}), a field tagged unique or
// a uniqueIndex); a model that names no row that way fails with ErrNoRow
// rather than claiming the whole table. From then on the row refuses
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
// token, with ErrNoFence for a model without a Fence column, and with
// ErrNoRow for a model that names no row. Claiming a
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
	tx := db.Model(model)
	if _, hasWhere := db.Statement.Clauses["WHERE"]; !hasWhere {
		rv := reflect.Indirect(reflect.ValueOf(model))
		if _, zero := pk.ValueOf(db.Statement.Context, rv); zero {
			conds, ok := uniqueKeyOf(db, stmt, rv)
			if !ok {
				return fmt.Errorf("%w: %s: set its primary key or all fields of a unique index, or give conditions (db.Where)", ErrNoRow, stmt.Schema.Table)
			}
			tx = tx.Where(conds)
		}
	}
	// SET pk = pk, fence = token WHERE <key> AND fence <= token
	return tx.UpdateColumn(pk.DBName, clause.Expr{SQL: "?", Vars: []any{clause.Column{Name: pk.DBName}}}).Error
}

// ErrNoRow is returned by Claim for a model that names no row: its primary
// key is zero, no unique index has all its fields set, and db has no
// conditions. Such a claim would otherwise raise the fence of every row.
var ErrNoRow = errors.New("gormplugin: claim names no row")

// uniqueKeyOf returns the conditions on the first unique key of the model
// value rv whose fields are all set: a field tagged unique, or a unique
// index, in the order the schema declares them.
func uniqueKeyOf(db *gorm.DB, stmt *gorm.Statement, rv reflect.Value) (map[string]any, bool) {
	ctx := db.Statement.Context
	set := func(fields ...*schema.Field) (map[string]any, bool) {
		conds := make(map[string]any, len(fields))
		for _, f := range fields {
			v, zero := f.ValueOf(ctx, rv)
			if zero {
				return nil, false
			}
			conds[f.DBName] = v
		}
		return conds, len(conds) > 0
	}
	for _, f := range stmt.Schema.Fields {
		if f.Unique {
			if conds, ok := set(f); ok {
				return conds, true
			}
		}
	}
	for _, idx := range stmt.Schema.ParseIndexes() { // in declaration order
		if idx.Class != "UNIQUE" || idx.Where != "" {
			continue
		}
		fields := make([]*schema.Field, 0, len(idx.Fields))
		for _, f := range idx.Fields {
			if f.Field != nil { // an expression has no field to take a value from
				fields = append(fields, f.Field)
			}
		}
		if len(fields) == len(idx.Fields) {
			if conds, ok := set(fields...); ok {
				return conds, true
			}
		}
	}
	return nil, false
}
