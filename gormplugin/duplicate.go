package gormplugin

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// ErrDuplicate is the errors.Is target of every write refused by a unique
// index (MySQL error 1062). The error is a *DuplicateError, which names the
// index so that a handler can tell, say, "this user already ordered this
// SKU" (unique (user_id, sku)) from "this idempotency key was used before".
var ErrDuplicate = errors.New("gormplugin: duplicate entry")

// mysqlDuplicateEntry is ER_DUP_ENTRY.
const mysqlDuplicateEntry = 1062

// DuplicateError describes a write refused by a unique index. It matches
// ErrDuplicate and gorm.ErrDuplicatedKey under errors.Is, and unwraps to the
// driver's *mysql.MySQLError.
type DuplicateError struct {
	Table string // the table written, as GORM named it; empty for raw SQL
	Index string // the violated index, e.g. "idx_user_sku"; "PRIMARY" for the primary key
	Value string // the duplicate value as the server printed it; parts of a composite key are joined by '-'
	Err   error  // the driver's error
}

// Error describes the violation.
func (e *DuplicateError) Error() string {
	msg := "gormplugin: duplicate entry " + strconv.Quote(e.Value) + " for unique index " + e.Index
	if e.Table != "" {
		msg += " of " + e.Table
	}
	return msg
}

// Is reports whether target is ErrDuplicate or gorm.ErrDuplicatedKey.
func (e *DuplicateError) Is(target error) bool {
	return target == ErrDuplicate || target == gorm.ErrDuplicatedKey
}

// Unwrap returns the driver's error.
func (e *DuplicateError) Unwrap() error { return e.Err }

// duplicateOf turns a MySQL duplicate-entry error into a *DuplicateError and
// returns any other error unchanged.
func duplicateOf(table string, err error) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != mysqlDuplicateEntry {
		return err
	}
	value, index := parseDuplicate(me.Message)
	// MySQL 8 qualifies the index with its table ("orders.idx_user_sku"),
	// MariaDB does not.
	if t, i, ok := strings.Cut(index, "."); ok && (table == "" || t == table || strings.HasSuffix(table, "."+t)) {
		index = i
		if table == "" {
			table = t
		}
	}
	return &DuplicateError{Table: table, Index: index, Value: value, Err: err}
}

// parseDuplicate reads "Duplicate entry 'v' for key 'k'". A message in
// another shape (another server language) leaves the index empty.
func parseDuplicate(msg string) (value, index string) {
	const prefix, middle = "Duplicate entry '", "' for key '"
	body, ok := strings.CutPrefix(msg, prefix)
	if !ok {
		return "", ""
	}
	body, ok = strings.CutSuffix(body, "'")
	if !ok {
		return "", ""
	}
	i := strings.LastIndex(body, middle)
	if i < 0 {
		return "", ""
	}
	return body[:i], body[i+len(middle):]
}

// duplicateWatch wraps a statement's connection pool while the statement
// runs, so that a duplicate-entry error is translated before GORM sees it:
// with gorm.Config.TranslateError set, GORM would replace it with
// gorm.ErrDuplicatedKey and lose the index name. A *DuplicateError still
// matches gorm.ErrDuplicatedKey.
type duplicateWatch struct {
	gorm.ConnPool
	table string
}

func (c duplicateWatch) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := c.ConnPool.ExecContext(ctx, query, args...)
	return res, duplicateOf(c.table, err)
}

func (c duplicateWatch) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, err := c.ConnPool.QueryContext(ctx, query, args...)
	return rows, duplicateOf(c.table, err)
}

// watchDuplicates runs just before GORM sends a statement. It comes after
// GORM's own begin-transaction callback, which must see the pool unwrapped.
func watchDuplicates(db *gorm.DB) {
	if db.Error != nil {
		return
	}
	if _, ok := db.Statement.ConnPool.(duplicateWatch); !ok {
		db.Statement.ConnPool = duplicateWatch{ConnPool: db.Statement.ConnPool, table: db.Statement.Table}
	}
}

// unwatchDuplicates restores the pool right after the statement, before
// GORM commits or rolls back the transaction it began.
func unwatchDuplicates(db *gorm.DB) {
	if w, ok := db.Statement.ConnPool.(duplicateWatch); ok {
		db.Statement.ConnPool = w.ConnPool
	}
}
