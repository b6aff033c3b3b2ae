package guard

import (
	"context"
	"errors"
	"time"

	"github.com/gin-gonic/gin"
)

// A Session is the critical section that the requests of one batch share
// on a combining route (Combining): a database transaction, with a
// savepoint before each request. gormplugin.Batch(db) is the Session of a
// GORM database. The Guard calls its methods one at a time, from the
// goroutine of the request that leads the batch or of the request whose
// turn it is, never concurrently for one batch.
type Session interface {
	// Begin starts the batch's work under ctx, the context of the lock's
	// hold (it carries the fencing token and is cancelled with cause
	// lock.ErrLost when the lock is lost), and returns the context the
	// batch runs in: Begin's ctx with what the handlers need to find the
	// work (the transaction) added as values.
	Begin(ctx context.Context) (context.Context, error)
	// Savepoint marks, in the work of the batch ctx belongs to, where the
	// next request's part begins; RollbackTo undoes everything done since
	// the mark of that name.
	Savepoint(ctx context.Context, name string) error
	// RollbackTo undoes the work since the Savepoint of that name.
	RollbackTo(ctx context.Context, name string) error
	// End commits the batch's work (commit true) or undoes it all.
	End(ctx context.Context, commit bool) error
}

// Defaults of the combining options.
const (
	// DefaultMaxBatch is the most requests one batch runs: as many as
	// the clients a busy instance usually has in flight, so that one batch
	// takes everyone who waits (32 measured lower throughput and a higher
	// p99 on one hot SKU with 64 clients).
	DefaultMaxBatch = 64
	// DefaultMaxBatchTime bounds how long a batch takes in requests: after
	// it, the holder runs what it took, commits and lets the lock go, so
	// that a steady stream of one instance's requests never keeps the lock
	// from the others.
	DefaultMaxBatchTime = 25 * time.Millisecond
)

// Combining makes a Lock route combine its requests: while one request of
// this instance holds a key's lock, the requests of this instance that
// arrive for the same key wait in line behind it in the process and are
// handed to the holder in batches. The holder runs one critical section of
// s for the batch — one transaction and one commit with gormplugin.Batch —
// and calls the route's handler once per request, in arrival order, each
// in a savepoint of its own; each request gets its own answer.
//
//   - A lone request runs at once: a request leads a batch as soon as it
//     finds no batch of its key taking requests in the process, so
//     combining never adds waiting when there is nobody to combine with.
//     A batch takes the requests that wait when it begins and those that
//     arrive while it runs, up to MaxBatch requests and MaxBatchTime; the
//     first request still waiting then leads the next batch.
//   - Across instances nothing changes: the lock is taken per key, once
//     per batch, with Wait and Lease as on any Lock route, and its
//     fencing token fences every write of the batch.
//   - A handler whose answer is not a success (a status of 400 or more),
//     or that panics, has its part rolled back to its savepoint; the
//     others of the batch keep theirs. Answers are held back until the
//     batch's commit: if it fails, every request of the batch is answered
//     as a lost lock is ("lock_lost" or "stale_write", 409) when the lock
//     was lost or a write refused as stale, and 503 "batch_failed"
//     otherwise; none of them is stored by Idempotent.
//   - Each request keeps its own context: its Idempotent record, its
//     deadline, its cancellation. A request waits in line at most the
//     route's Wait from its arrival, as it would wait for the lock (so a
//     route with Wait(0) combines nothing); one that ends or runs out of
//     Wait while it waits in line leaves without affecting the batch
//     (answered 499, or 429 busy). The handler's request context carries the
//     lock's token and the Session's work and is cancelled when the
//     request ends or the lock is lost; the work's own statements run in
//     the batch's context, so a request that goes away during its turn
//     never breaks the transaction of the others.
//
// The handler finds the batch's work in its request context (with
// gormplugin.Batch: gormplugin.Tx(c.Request.Context())) and must write
// through it. A route with FailOpen whose lock is unavailable runs each
// request alone in a Session of its own, without the lock.
func Combining(s Session) RouteOption {
	if s == nil {
		return invalid("Combining(nil): a combining route needs a Session (gormplugin.Batch(db))")
	}
	return option(useLock, "Combining", func(r *route) { r.session = s })
}

// MaxBatch sets the most requests one batch of a Combining route runs.
// Default DefaultMaxBatch (64); 1 turns combining off (every request runs
// alone in its Session).
func MaxBatch(n int) RouteOption {
	if n < 1 {
		return invalid("MaxBatch(%d): want at least 1", n)
	}
	return option(useLock, "MaxBatch", func(r *route) { r.maxBatch, r.batchOpts = n, true })
}

// MaxBatchTime sets how long a batch of a Combining route takes in
// requests before it commits. Default DefaultMaxBatchTime (25ms).
func MaxBatchTime(d time.Duration) RouteOption {
	if d <= 0 {
		return invalid("MaxBatchTime(%v): must be positive", d)
	}
	return option(useLock, "MaxBatchTime", func(r *route) { r.maxBatchTime, r.batchOpts = d, true })
}

// ErrBatchFailed is the error of the requests of a batch whose Session
// failed to begin or to commit for another reason than a lost lock: they
// are answered 503 {"error":"batch_failed"}, and the Session's error is
// added with c.Error.
var ErrBatchFailed = errors.New("guard: the batch's work failed")

// commitHooksName is the gin context key of the OnCommit functions of a
// request in its batch's turn.
const commitHooksName = "seckillguard.batch.oncommit"

// OnCommit runs f once the transaction the request's handler wrote in has
// committed: on a Combining route when the request's batch has committed,
// before the request is answered, and never when the batch fails; on any
// other route at once (the handler's own transaction is over when it calls
// OnCommit). It is for what must follow the commit and only the commit: a
// counter of orders, an in-memory note that a SKU is sold out.
func OnCommit(c *gin.Context, f func()) {
	if v, ok := c.Get(commitHooksName); ok {
		if hooks, ok := v.(*[]func()); ok {
			*hooks = append(*hooks, f)
			return
		}
	}
	f()
}
