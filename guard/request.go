package guard

import (
	"context"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/lock"
)

// A request is the guard's state of one request, shared by every guard step
// the request runs, in whatever order they were registered (router-level
// Use, per route, a policy): the first step to run creates it and the others
// join it. It makes the order of Lock, Idempotent and Combining not matter:
//
//   - What decides whether an answer may be replayed is gathered here as the
//     steps learn it: the framework answered itself, the lock step judged
//     a lost lock or a stale write, a combining batch failed, the handler
//     panicked.
//   - The idempotency record is settled once, by the step that finishes
//     last, when the final answer is known: after the lock step's judgment,
//     and on a combining route after the batch committed or failed. Answers
//     still go to the client as they are written (only a combining batch
//     holds them); what waits is the decision to store.
//
// It lives on the gin context, for the request's goroutine only.
type request struct {
	// base is the request's context when its first step began: an
	// idempotency key is claimed for it, so that the claim lasts until the
	// record is settled whatever the steps inside do to the request's
	// context (a batch's turn ends before its batch commits); the claim
	// outlives base too, when the client goes away while the handler runs.
	base  context.Context
	depth int // steps begun and not yet ended

	framework    bool // the framework answered itself: store nothing
	unrepeatable bool // the work did not happen as asked (stale write, lost lock, failed batch)
	panicked     bool // the handler panicked
	batched      bool // a combining step runs the rest of the chain in a batch's turn

	claim *claim // the request's idempotency claim; nil without one
	// slot holds the claim an idempotency step builds, in the request's own
	// allocation.
	slot claim

	// The lock the request holds (Key, RedisKey): its resolved name and the
	// lock Client that took it.
	lockKey string
	locks   *lock.Client
}

// requestName is the gin context key of the request's state.
const requestName = "seckillguard.request"

// stateOf returns the state of c's request, or nil before its first step.
func stateOf(c *gin.Context) *request {
	if v, ok := c.Get(requestName); ok {
		st, _ := v.(*request)
		return st
	}
	return nil
}

// begin starts a guard step of c's request: it creates the request's
// state, or joins it. Every begin is matched by an end.
func begin(c *gin.Context) *request {
	st := stateOf(c)
	if st == nil {
		st = &request{base: c.Request.Context()}
		c.Set(requestName, st)
	}
	st.depth++
	return st
}

// end ends a guard step begun with begin; returned is false when the step
// ends by a panic of the chain it ran. The last step to end settles the
// request's idempotency record.
func (st *request) end(c *gin.Context, returned bool) {
	if !returned {
		st.panicked = true
	}
	st.depth--
	if st.depth > 0 || st.claim == nil {
		return
	}
	cl := st.claim
	st.claim = nil
	cl.settle(c, st)
}
