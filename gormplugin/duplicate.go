package gormplugin

import (
	"errors"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// ErrDuplicate is the errors.Is target of every write refused by a unique
// index (MySQL error 1062, SQLite's SQLITE_CONSTRAINT_UNIQUE and
// SQLITE_CONSTRAINT_PRIMARYKEY). The error is a *DuplicateError, which names the
// index so that a handler can tell, say, "this user already ordered this
// SKU" (unique (user_id, sku)) from "this idempotency key was used before".
var ErrDuplicate = errors.New("gormplugin: duplicate entry")

// mysqlDuplicateEntry is ER_DUP_ENTRY.
const mysqlDuplicateEntry = 1062

// DuplicateError describes a write refused by a unique index. It matches
// ErrDuplicate and gorm.ErrDuplicatedKey under errors.Is, and unwraps to the
// driver's error (*mysql.MySQLError on MySQL).
type DuplicateError struct {
	Table string // the table written, as GORM named it; empty for raw SQL on MySQL
	Index string // the violated index, e.g. "idx_user_sku"; "PRIMARY" for the primary key
	Value string // the duplicate value as the server printed it; parts of a composite key are joined by '-'; empty on SQLite, which does not print it
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

// duplicateOf turns a MySQL duplicate-entry error found in err into a
// *DuplicateError and returns any other error unchanged.
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

// untranslatedKey stores, in a statement's Settings, the *gorm.Config that
// watchDuplicates set aside.
type untranslatedKey struct{ stmt *gorm.Statement }

// watchDuplicates runs just before GORM sends a statement. With
// gorm.Config.TranslateError set, GORM would replace the driver's
// duplicate-entry error by gorm.ErrDuplicatedKey the moment it sees it, and
// the index name would be lost; so the statement runs on a copy of the
// configuration with translation off (the copy Session makes), and
// translateErrors does the translation once the statement is done. The copy
// belongs to this statement's *gorm.DB alone.
func watchDuplicates(db *gorm.DB) {
	if db.Error != nil || !db.Config.TranslateError {
		return
	}
	db.Statement.Settings.Store(untranslatedKey{db.Statement}, db.Config)
	cfg := *db.Config
	cfg.TranslateError = false
	db.Config = &cfg
}

// translateErrors runs right after the statement: a duplicate-entry error
// becomes a *DuplicateError, and with TranslateError set every other error
// is translated by the dialect as GORM would have done.
func translateErrors(db *gorm.DB) {
	stmt := db.Statement
	translate := false
	if cfg, ok := stmt.Settings.LoadAndDelete(untranslatedKey{stmt}); ok {
		db.Config = cfg.(*gorm.Config)
		translate = true
	}
	if db.Error == nil {
		return
	}
	err := duplicateIn(db, db.Error)
	if t, ok := db.Dialector.(gorm.ErrorTranslator); ok && translate && err == db.Error {
		err = t.Translate(err)
	}
	db.Error = err
	if stmt.Result != nil {
		stmt.Result.Error = err
	}
}
