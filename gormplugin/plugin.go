// Package gormplugin is the database backstop of seckillguard: a GORM plugin
// that refuses writes carrying a stale fencing token and names the unique
// index a duplicate write violated.
//
// A model opts in by declaring a fence column:
//
//	type Product struct {
//		ID    uint
//		SKU   string `gorm:"uniqueIndex"`
//		Stock int
//		Fence gormplugin.Fence // BIGINT NOT NULL DEFAULT 0
//	}
//
//	db.Use(gormplugin.New())
//
// A write whose context carries a token (fencing.FromContext; the context a
// lock returns carries one) is fenced in the statement itself: an UPDATE gets
// "SET fence = token" and "AND fence <= token", a DELETE gets the condition,
// an INSERT writes the token into the column. A row that a newer token has
// already written is therefore never overwritten, and the write fails with an
// error that matches fencing.ErrStale instead of silently changing nothing.
//
// Stale detection costs nothing on the success path: only a fenced UPDATE or
// DELETE that changed no row runs one extra SELECT (a locking read, so it sees
// the newest committed fence even inside a transaction) to tell "a newer
// token got there first" (stale) from "no row matched the caller's own
// conditions" (not stale; RowsAffected stays 0). Upserts are the one
// exception, see Fence.
//
// Every statement is its own unit: a fenced statement that touches several
// rows applies to the rows whose fence the token may overwrite and skips the
// others, and it is stale only when it applied to none of the rows matching
// the caller's conditions while at least one of them carries a newer fence.
// Each row is a fenced resource of its own; a caller that needs a batch to be
// all-or-nothing runs it in a transaction and compares RowsAffected with the
// number of rows it meant to change.
//
// Writes without a token run exactly like plain GORM, with no extra query,
// unless the plugin is Strict. Writes by table name alone (no model) and raw
// SQL (db.Exec) are not fenced, because the plugin finds the fence column
// through the model's schema; like every other write, though, they are
// refused with a *fencing.StaleError once the token's context is done (the
// lock was lost), so a holder that lost its lock writes nothing.
//
// Unique-index violations (MySQL error 1062, SQLite's "UNIQUE constraint
// failed") become a *DuplicateError naming the index, on every write and
// whether or not gorm.Config.TranslateError is set; see ErrDuplicate.
//
// The plugin supports MySQL and MariaDB through gorm.io/driver/mysql, and
// SQLite through GORM's "sqlite" dialects (github.com/glebarez/sqlite, pure
// Go, or gorm.io/driver/sqlite). On MySQL, setting clientFoundRows=true in
// the DSN is recommended: MySQL then counts the rows an UPDATE matched rather
// than the rows it changed (as SQLite always does), so a reentrant write that
// repeats the values and the token already stored reports its row without
// needing the check SELECT. Without it such a write reports 0 rows,
// the check SELECT finds no newer fence, and the write succeeds with
// RowsAffected 0.
package gormplugin

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// ErrNoToken is returned by a Strict plugin for a write to a model with a
// Fence column whose context carries no fencing token.
var ErrNoToken = errors.New("gormplugin: write without a fencing token")

// ErrUnsupported is returned for a fenced write the plugin cannot make safe,
// before it is sent to the database.
var ErrUnsupported = errors.New("gormplugin: unsupported fenced write")

// pluginName is the key under which the plugin registers with GORM.
const pluginName = "seckillguard:gormplugin"

// Plugin is the GORM plugin that enforces Fence columns and translates
// unique-index violations. Create it with New and install it with db.Use.
// One Plugin may be installed on several *gorm.DB.
type Plugin struct {
	strict bool
}

// Option configures a Plugin.
type Option func(*Plugin)

// Strict makes the plugin refuse every write to a model that has a Fence
// column when the write's context carries no fencing token; the write fails
// with ErrNoToken before anything is sent. Models without a Fence column are
// not affected: declaring the column is the per-model opt-in, Strict decides
// whether such a model may also be written outside a lock.
//
// Default: not strict; token-less writes run exactly like plain GORM.
func Strict() Option {
	return func(p *Plugin) { p.strict = true }
}

// New returns the plugin, configured by opts.
func New(opts ...Option) *Plugin {
	p := &Plugin{}
	for _, opt := range opts {
		opt(p)
	}
	return p
}

// Name returns the name the plugin registers under; part of gorm.Plugin.
func (p *Plugin) Name() string { return pluginName }

// Initialize registers the plugin's callbacks and clause builders on db;
// part of gorm.Plugin, called by db.Use. It fails for databases other than
// MySQL, MariaDB and SQLite.
func (p *Plugin) Initialize(db *gorm.DB) error {
	if name := db.Dialector.Name(); !supportedDialect(name) {
		return fmt.Errorf("gormplugin: dialect %q is not supported (MySQL, MariaDB and SQLite only)", name)
	}
	// GORM places an After callback at the end of the chain, so verify is
	// also anchored before the callback that follows the statement: it must
	// run before the hooks and before the transaction is committed.
	create, update, del, raw := db.Callback().Create(), db.Callback().Update(), db.Callback().Delete(), db.Callback().Raw()
	err := errors.Join(
		create.Before("*").Register(pluginName+":guard", p.guard),
		create.Before("gorm:create").Register(pluginName+":watch", watchDuplicates),
		create.After("gorm:create").Before("gorm:save_after_associations").Register(pluginName+":verify", p.verify),
		create.Before("gorm:commit_or_rollback_transaction").Register(pluginName+":mark_commit", markCommit),
		create.After("gorm:commit_or_rollback_transaction").Register(pluginName+":refuse_late", refuseLate),

		update.Before("*").Register(pluginName+":guard", p.guard),
		update.Before("gorm:update").Register(pluginName+":watch", watchDuplicates),
		update.After("gorm:update").Before("gorm:save_after_associations").Register(pluginName+":verify", p.verify),
		update.Before("gorm:commit_or_rollback_transaction").Register(pluginName+":mark_commit", markCommit),
		update.After("gorm:commit_or_rollback_transaction").Register(pluginName+":refuse_late", refuseLate),

		del.Before("*").Register(pluginName+":guard", p.guard),
		del.Before("gorm:delete").Register(pluginName+":watch", watchDuplicates),
		del.After("gorm:delete").Before("gorm:after_delete").Register(pluginName+":verify", p.verify),
		del.Before("gorm:commit_or_rollback_transaction").Register(pluginName+":mark_commit", markCommit),
		del.After("gorm:commit_or_rollback_transaction").Register(pluginName+":refuse_late", refuseLate),

		// Raw SQL (db.Exec) is not fenced, but under a lost lock it is
		// refused like any other write, and it names violated indexes.
		raw.Before("*").Register(pluginName+":guard", p.guard),
		raw.Before("gorm:raw").Register(pluginName+":watch", watchDuplicates),
		raw.After("gorm:raw").Register(pluginName+":verify", translateErrors),
		raw.After("gorm:raw").Register(pluginName+":refuse_late", refuseLateRaw),
	)
	if err != nil {
		return fmt.Errorf("gormplugin: register callbacks: %w", err)
	}
	installClauseBuilders(db)
	return nil
}

// write is the per-statement state of a fenced write.
type write struct {
	field  *schema.Field  // the fence column
	token  fencing.Token  // the token the write carries
	upsert *upsertTargets // set when the INSERT updates rows on conflict
}

// writeKey stores a statement's *write in its Settings. The statement pointer
// is part of the key because GORM copies Settings into the statements it
// derives from this one (hooks, associations), which are fenced on their own.
type writeKey struct{ stmt *gorm.Statement }

func writeOf(stmt *gorm.Statement) *write {
	if v, ok := stmt.Settings.Load(writeKey{stmt}); ok {
		return v.(*write)
	}
	return nil
}

// guard runs first on every create, update, delete and raw SQL statement
// (db.Exec): it refuses token-less
// writes in strict mode and writes whose token context is already done, and
// marks fenced writes for the clause builders and verify.
func (p *Plugin) guard(db *gorm.DB) {
	if db.Error != nil {
		return
	}
	stmt := db.Statement
	field := fenceField(stmt.Schema)
	token, ok := fencing.FromContext(stmt.Context)
	if !ok {
		if p.strict && field != nil {
			db.AddError(fmt.Errorf("%w: %s has a fence column and the plugin is strict", ErrNoToken, stmt.Table))
		}
		return
	}
	// The hold's own context: for a *gin.Context it is not stmt.Context.
	if holder := fencing.Holder(stmt.Context); ctxend.Ended(holder) {
		db.AddError(refusedIn(holder, stmt.Table, token))
		return
	}
	if field != nil {
		stmt.Settings.Store(writeKey{stmt}, &write{field: field, token: token})
	}
}

// verify runs right after the statement, before the model's after-hooks and
// before GORM commits its default transaction: it translates a duplicate
// entry, reports a stale write, and records the token in the model's fence
// field.
func (p *Plugin) verify(db *gorm.DB) {
	translateErrors(db)
	stmt := db.Statement
	w := writeOf(stmt)
	if w == nil {
		return
	}
	stmt.Settings.Delete(writeKey{stmt})
	if db.Error != nil || db.DryRun || stmt.SQL.Len() == 0 {
		return
	}
	switch {
	case w.upsert != nil:
		checkUpsert(db, w)
	case db.RowsAffected == 0 && !isInsert(stmt):
		checkUnchanged(db, w)
	}
	if db.Error == nil && (db.RowsAffected > 0 || isInsert(stmt)) && !isDelete(stmt) {
		recordToken(stmt, w)
	}
}

func isInsert(stmt *gorm.Statement) bool {
	_, ok := stmt.Clauses["INSERT"]
	return ok
}

func isDelete(stmt *gorm.Statement) bool {
	_, ok := stmt.Clauses["DELETE"]
	return ok
}

// recordToken sets the fence field of the written model values to the token,
// so that the values in memory match the rows in the database.
func recordToken(stmt *gorm.Statement, w *write) {
	rv := stmt.ReflectValue
	switch rv.Kind() {
	case reflect.Struct:
		if rv.CanAddr() && rv.Type() == stmt.Schema.ModelType {
			_ = w.field.Set(stmt.Context, rv, int64(w.token))
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < rv.Len(); i++ {
			if e := reflect.Indirect(rv.Index(i)); e.Kind() == reflect.Struct && e.CanAddr() && e.Type() == stmt.Schema.ModelType {
				_ = w.field.Set(stmt.Context, e, int64(w.token))
			}
		}
	}
}
