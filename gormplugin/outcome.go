package gormplugin

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
)

// ErrOutcomeUnknown is the errors.Is target of a write that may or may not
// have been applied: the statement (outside any transaction) or the COMMIT
// (of GORM's default transaction, or of Transaction) reached the database,
// and its answer never came back — the connection broke, or the write's
// context ended while the server was still working on it (waiting for a
// row lock held by another transaction, say), and the driver gave up on it.
// The server may apply such a write afterwards.
//
// It matches neither success nor fencing.ErrStale: "stale" always means
// "not applied". The driver's error, and the context's cause when the
// context ended (lock.ErrLost), stay visible to errors.Is. A caller that
// must know reads the row again (its fence column says which token wrote it
// last), or retries under an idempotency key that a unique index backs.
var ErrOutcomeUnknown = errors.New("gormplugin: outcome of the write unknown")

// commitKey marks, in a statement's Settings, that the statement itself
// succeeded and GORM's default transaction is about to be committed: an
// error found afterwards is the COMMIT's.
type commitKey struct{ stmt *gorm.Statement }

// markCommit runs just before GORM commits or rolls back its default
// transaction.
func markCommit(db *gorm.DB) {
	if db.Error != nil || db.SkipDefaultTransaction {
		return // no default transaction was begun
	}
	if _, ok := db.InstanceGet("gorm:started_transaction"); ok {
		db.Statement.Settings.Store(commitKey{db.Statement}, true)
	}
}

// refuseLate runs last: a write whose token context ended while it was on
// its way (after guard let it through) failed with the context's error, or
// with whatever the driver made of the cancellation ("invalid connection"),
// and GORM's rollback of its default transaction may have added
// sql.ErrTxDone, hiding the first error from errors.Is.
//
// Inside a transaction (GORM's default one, or the caller's) such a
// statement was not applied — the transaction it ran in is not committed —
// and it is reported like one refused up front. The COMMIT of GORM's default
// transaction is judged by commitError. Outside any transaction the
// statement may have reached the server, which can still apply it (once the
// row lock it waits for is released): a context error or a broken connection
// there is ErrOutcomeUnknown, never stale.
func refuseLate(db *gorm.DB) { refuseLateIn(db, inTransaction(db)) }

// refuseLateRaw is refuseLate for db.Exec, which runs without GORM's default
// transaction.
func refuseLateRaw(db *gorm.DB) {
	_, inTx := db.Statement.ConnPool.(gorm.TxCommitter)
	refuseLateIn(db, inTx)
}

func refuseLateIn(db *gorm.DB, inTx bool) {
	stmt := db.Statement
	_, committing := stmt.Settings.LoadAndDelete(commitKey{stmt})
	if db.Error == nil || errors.Is(db.Error, fencing.ErrStale) || errors.Is(db.Error, ErrDuplicate) ||
		errors.Is(db.Error, ErrOutcomeUnknown) {
		return
	}
	err := db.Error
	token, fenced := fencing.FromContext(stmt.Context)
	// The hold's own context, which a *gin.Context is not (see guard).
	holder := fencing.Holder(stmt.Context)
	ended := fenced && ctxend.Ended(holder)
	switch {
	case committing:
		err = commitError(stmt.Context, stmt.Table, err)
	case inTx:
		if ended {
			err = refusedIn(holder, stmt.Table, token)
		}
	case mayHaveRun(stmt.Context, err):
		err = unknown(holder, "write to "+stmt.Table, err)
	case ended && errors.Is(err, sql.ErrTxDone):
		err = refusedIn(holder, stmt.Table, token)
	}
	if err != db.Error {
		db.Error = err
		if stmt.Result != nil {
			stmt.Result.Error = err
		}
	}
}

// mayHaveRun reports whether a statement that failed with err may have
// been sent and run by the server: the connection broke after sending
// (mysql.ErrInvalidConn), or the driver abandoned it because ctx ended. A
// context error can also come from before the statement was sent (database/sql
// checks the context first); that cannot be told apart, so it counts as
// unknown. driver.ErrBadConn is returned only for statements not sent.
func mayHaveRun(ctx context.Context, err error) bool {
	if errors.Is(err, driver.ErrBadConn) {
		return false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return false // the server answered
	}
	if errors.Is(err, mysql.ErrInvalidConn) {
		return true
	}
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}

// commitError judges the error of a COMMIT. database/sql sends no COMMIT
// once the transaction's context has ended (it answers the context's error
// or sql.ErrTxDone and rolls back), so those errors mean "not applied", and
// stale if the context carried a token. An error the server answered is a
// failed commit. Anything else — the connection broke with the COMMIT sent
// — is ErrOutcomeUnknown.
func commitError(ctx context.Context, table string, err error) error {
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrTxDone) || ctx.Err() != nil && errors.Is(err, ctx.Err()):
		if token, ok := fencing.FromContext(ctx); ok && ctxend.Ended(ctx) {
			return refusedIn(ctx, table, token)
		}
		return err
	case errors.As(err, &me), errors.Is(err, driver.ErrBadConn):
		return err
	}
	what := "commit"
	if table != "" {
		what = "commit a write to " + table
	}
	return unknown(ctx, what, err)
}

// unknown wraps err, the driver's, as ErrOutcomeUnknown, keeping the
// context's cause visible when the context ended.
func unknown(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			return fmt.Errorf("%w: %s: %w (%w)", ErrOutcomeUnknown, what, err, cause)
		}
	}
	return fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, what, err)
}

// Transaction runs fc in a transaction, as db.Transaction does, and judges
// its COMMIT as the plugin judges the COMMIT of GORM's default transaction:
// a COMMIT whose answer was lost is ErrOutcomeUnknown (the transaction may
// have committed), and a COMMIT that database/sql refused to send because
// the context carrying a lock's token ended is stale. fc's own errors and
// those of its statements are returned as they are; a statement the plugin
// refused is stale, and the transaction is rolled back.
//
// db.Transaction returns the driver's error for a failed COMMIT, and cannot
// tell "not committed" from "maybe committed"; use Transaction where the
// difference matters (a retry would charge twice).
func Transaction(db *gorm.DB, fc func(tx *gorm.DB) error, opts ...*sql.TxOptions) error {
	committing := false
	err := db.Transaction(func(tx *gorm.DB) error {
		// Inside a transaction GORM's default one is never begun: each
		// write would only find that out, at the cost of a session of its
		// own (about 20 allocations) and the lookups around it.
		if err := fc(tx.Session(&gorm.Session{SkipDefaultTransaction: true})); err != nil {
			return err
		}
		committing = true
		return nil
	}, opts...)
	if err == nil || !committing {
		return err
	}
	return commitError(db.Statement.Context, "", err)
}

// inTransaction reports whether the statement ran in a transaction: GORM's
// default one around each write, or one the caller began.
func inTransaction(db *gorm.DB) bool {
	if _, ok := db.Statement.ConnPool.(gorm.TxCommitter); ok {
		return true
	}
	return !db.SkipDefaultTransaction
}

// refused is the error for a write whose token context is done: the lock
// that issued the token is gone (or the caller gave up), so the write is
// refused as stale. The cause (lock.ErrLost when the lock was lost) and the
// context's own error both stay visible to errors.Is.
func refused(stmt *gorm.Statement, token fencing.Token) error {
	return refusedIn(stmt.Context, stmt.Table, token)
}

func refusedIn(ctx context.Context, table string, token fencing.Token) error {
	cause := context.Cause(ctx)
	if err := ctx.Err(); cause != err {
		cause = fmt.Errorf("%w (%w)", cause, err)
	}
	return &fencing.StaleError{Resource: table, Token: token, Cause: cause}
}
