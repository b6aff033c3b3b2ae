package gormplugin

import (
	"database/sql"
	"fmt"
	"reflect"
	"strings"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// checkUnchanged runs after a fenced UPDATE or DELETE that changed no row.
// The statement may have matched no row, matched rows whose values it left
// as they were (MySQL counts changed rows unless clientFoundRows is set), or
// been refused by the fence; only the last is stale.
func checkUnchanged(db *gorm.DB, w *write) {
	reportNewer(db, w, db.Statement.Schema.PrimaryFieldDBNames, conditionsWithoutFence(db.Statement))
}

// checkUpsert runs after every fenced upsert that updates on conflict: its
// affected-row count says nothing about skipped rows (MariaDB's RETURNING
// returns every row, and clientFoundRows counts a skipped row like an
// inserted one), so it looks up its rows by their key.
func checkUpsert(db *gorm.DB, w *write) {
	column, values := schema.ToQueryValues("", w.upsert.columns, w.upsert.values)
	reportNewer(db, w, w.upsert.columns, []clause.Expression{clause.IN{Column: column, Values: values}})
}

// reportNewer fails the statement with a *fencing.StaleError when a row
// matching conds carries a fence newer than the write's token. It runs one
// SELECT in the statement's own connection or transaction; the SELECT is a
// locking read, so it sees the newest committed fence even where a plain read
// would see the transaction's older snapshot. keys name the row in the error.
func reportNewer(db *gorm.DB, w *write, keys []string, conds []clause.Expression) {
	stmt := db.Statement
	fence := clause.Column{Table: clause.CurrentTable, Name: w.field.DBName}
	columns := append(keys[:len(keys):len(keys)], w.field.DBName)

	q := db.Session(&gorm.Session{NewDB: true}).
		Unscoped(). // the statement's own conditions already say which rows count
		Model(reflect.New(stmt.Schema.ModelType).Interface()).
		Table(stmt.Table).
		Select(columns).
		Clauses(clause.Where{Exprs: append(conds[:len(conds):len(conds)], clause.Gt{Column: fence, Value: int64(w.token)})}).
		Order(clause.OrderByColumn{Column: fence, Desc: true}).
		Limit(1).
		Clauses(clause.Locking{Strength: clause.LockingStrengthShare})
	rows, err := q.Rows()
	if err != nil {
		failCheck(db, w, err)
		return
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			failCheck(db, w, err)
		}
		return
	}
	keyValues := make([]any, len(keys))
	dest := make([]any, 0, len(columns))
	for i := range keyValues {
		dest = append(dest, &keyValues[i])
	}
	var current sql.NullInt64
	dest = append(dest, &current)
	if err := rows.Scan(dest...); err != nil {
		failCheck(db, w, err)
		return
	}
	db.AddError(fencing.Stale(stmt.Table, formatKey(keys, keyValues), w.token, fencing.Token(current.Int64)))
}

// failCheck reports a check SELECT that failed. A check cut short because
// the token's context ended is a refused write like any other.
func failCheck(db *gorm.DB, w *write, err error) {
	stmt := db.Statement
	if ctxend.Ended(stmt.Context) {
		db.AddError(refused(stmt, w.token))
		return
	}
	db.AddError(fmt.Errorf("gormplugin: check the fence of %s after a fenced write changed nothing: %w", stmt.Table, err))
}

// formatKey writes a row's key as "id=42" or "user_id=7,sku=sku-1".
func formatKey(names []string, values []any) string {
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name)
		b.WriteByte('=')
		switch v := values[i].(type) {
		case []byte:
			b.Write(v)
		default:
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}
