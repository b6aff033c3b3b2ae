package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
)

// What refused a stale purchase write (the "by" label of
// seckill_stale_writes_refused_total).
const (
	// The lock's context was cancelled (the lease ran out, or the watchdog
	// found the lock gone) before the write was sent: the plugin, or
	// database/sql for a transaction not yet begun, refused it in the
	// process.
	refusedLockLost = "lock_lost"
	// The write reached the database, whose fence column held a newer
	// token: another holder had written the row since.
	refusedFence = "fence"
)

// buy sells one unit of the SKU to the buyer, the way the usual flash-sale
// handler does: read the stock, check it, deduct in the application (stock = read -
// 1), create the order. In the guard modes it runs inside the lock of the
// policy file, with the lock's context as request context, so the writes
// carry the fencing token, and it reads the row with SELECT ... FOR UPDATE
// inside the transaction that writes it, so that the read is ordered among
// the fenced writes too (see readForUpdate). The read, the deduction and the
// order share that one transaction and its one commit, so an order refused
// by a unique index (the user already bought, or the idempotency key was
// used) gives its unit back. Nothing inside calls another service.
//
//	201 the order                       409 {"error":"sold_out"}
//	409 {"error":"already_purchased"}   404 {"error":"not_found"}
//	409 stale_write / lock_lost: the lock was lost and nothing was written
//	503 {"error":"outcome_unknown"}: the order may or may not have been
//	    written (the database's answer was lost); a retry with the same
//	    Idempotency-Key gets the order if it was
func (s *Service) buy(c *gin.Context) {
	ctx := c.Request.Context()
	sku, user := c.Param("sku"), c.GetString(userKey)
	if s.guard != nil && guard.Key(c) == "" {
		// The policy file does not lock this route: refuse loudly rather
		// than sell without the lock.
		s.log.ErrorContext(ctx, "seckill: purchase reached without a lock; check the lock entry of POST "+routeBuy+" in the policy file")
		ginmw.Abort(c, http.StatusInternalServerError, "not_locked")
		return
	}
	db := s.db.WithContext(ctx)
	_, fenced := fencing.FromContext(ctx)

	order := Order{UserID: user, SKU: sku}
	if rec, ok := guard.IdempotencyRecord(c); ok {
		fp, _ := guard.IdempotencyFingerprint(c)
		order.IdempotencyKey, order.IdempotencyFP = &rec, &fp
	}
	// take reads the stock through q, checks it and decides what to write.
	var left int
	take := func(q *gorm.DB) error {
		var p Product
		if err := q.Where("sku = ?", sku).Take(&p).Error; err != nil {
			return err
		}
		if p.Stock <= 0 {
			return errSoldOut
		}
		if f := s.afterRead.Load(); f != nil {
			(*f)()
		}
		s.pause()
		left = p.Stock - 1
		return nil
	}
	var err error
	if !fenced {
		// The modes without the distributed lock read as the usual handler
		// does, before the transaction and with nothing ordering the read
		// among other purchases' writes: the incident the demo shows.
		err = take(db)
	}
	if err == nil {
		// s.transaction: gormplugin.Transaction, or the batch's transaction
		// in mode guard-combine (see combine.go).
		err = s.transaction(ctx, db, func(tx *gorm.DB) error {
			if fenced {
				if err := take(readForUpdate(tx)); err != nil {
					return err
				}
			}
			// UPDATE products SET stock = <left>, fence = <token>
			// WHERE sku = ? AND fence <= <token>
			res := tx.Model(&Product{}).Where("sku = ?", sku).Update("stock", left)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected != 1 {
				return gorm.ErrRecordNotFound // deleted meanwhile
			}
			return tx.Create(&order).Error
		})
	}
	switch {
	case err == nil:
		// guard.OnCommit: in mode guard-combine the batch commits after
		// this handler returns, and may not.
		guard.OnCommit(c, func() {
			s.orders.Inc()
			if left == 0 {
				s.soldOut.mark(sku)
			}
		})
		c.JSON(http.StatusCreated, order)
	case errors.Is(err, errSoldOut):
		guard.OnCommit(c, func() { s.soldOut.mark(sku) })
		ginmw.Abort(c, http.StatusConflict, "sold_out")
	case errors.Is(err, gorm.ErrRecordNotFound):
		ginmw.Abort(c, http.StatusNotFound, "not_found")
	case s.undecided(c, err):
	case s.refused(c, ctx, err):
	case errors.Is(err, gormplugin.ErrDuplicate):
		s.duplicate(c, ctx, order, err)
	default:
		s.internal(c, "purchase", err)
	}
}

// errSoldOut ends a purchase that found no stock left; nothing is written.
var errSoldOut = errors.New("seckill: sold out")

// readForUpdate makes the purchase's read a locking read, SELECT ... FOR
// UPDATE, inside the transaction tx that then writes the row. It gives the
// read the place among the fenced writes that a claim (gormplugin.Claim)
// would, with no statement and no commit of its own:
//
//   - A write of an older lock holder (one that lost the lock without
//     noticing in time) that arrives after the read waits for the row lock
//     until this transaction ends; by then the row's fence holds this
//     purchase's token, and the fence refuses the older write. Without the
//     row lock it would be accepted between the read and the write and then
//     overwritten by stock = read - 1: a unit sold twice.
//   - An older holder's write that holds the row lock first is waited for,
//     and the read returns what it committed (a locking read reads the
//     newest committed row, not the transaction's snapshot).
//   - A write with a newer token that committed before the read has left a
//     newer fence on the row: this purchase's fenced UPDATE changes nothing
//     and is refused as stale.
//
// On SQLite, which has no row locks, the dialect drops the FOR UPDATE; the
// service's SQLite transactions take the database's write lock when they
// begin (_txlock=immediate), which orders the read the same way.
func readForUpdate(tx *gorm.DB) *gorm.DB {
	return tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
}

// pause sleeps HoldDelay in HoldRate of the purchases. It does not watch the
// context: a GC pause does not notice that the lock is gone either.
func (s *Service) pause() {
	d, rate := s.cfg.HoldDelay, s.cfg.HoldRate
	if d <= 0 || (rate > 0 && rate < 1 && rand.Float64() >= rate) {
		return
	}
	time.Sleep(d)
}

// undecided answers a purchase whose write may or may not have been applied
// (gormplugin.ErrOutcomeUnknown): 503, so that the idempotency record is
// dropped and a retry runs again — and finds the order by its idempotency
// key or its (user, sku) index if the first attempt did commit. It is never
// counted as refused.
func (s *Service) undecided(c *gin.Context, err error) bool {
	if !errors.Is(err, gormplugin.ErrOutcomeUnknown) {
		return false
	}
	s.log.WarnContext(c.Request.Context(), "seckill: the outcome of a purchase's write is unknown; a retry finds out", "path", c.Request.URL.Path, "err", err)
	_ = c.Error(err)
	ginmw.Abort(c, http.StatusServiceUnavailable, "outcome_unknown", ginmw.RetryAfter(time.Second))
	return true
}

// refused reports whether err means that the backstop refused the
// purchase's writes because the lock was lost or overtaken, counts it, and
// answers 409 with guard.AbortStale ("stale_write", or "lock_lost" when the
// transaction could not even begin): an answer never stored for replay.
func (s *Service) refused(c *gin.Context, ctx context.Context, err error) bool {
	var se *fencing.StaleError
	switch {
	case errors.As(err, &se) && se.Current.Valid():
		s.stale.WithLabelValues(refusedFence).Inc()
	case errors.Is(err, fencing.ErrStale) || guard.Lost(ctx):
		s.stale.WithLabelValues(refusedLockLost).Inc()
	default:
		return false
	}
	guard.AbortStale(c, err)
	return true
}

// duplicate answers a purchase whose order a unique index refused: the
// order of the same idempotency key if there is one and the same request
// created it (the first request succeeded, and its Redis record was lost:
// expired, flushed or failed over), 422 idempotency_key_reused if another
// request did (the key sent again for another SKU), else
// already_purchased.
func (s *Service) duplicate(c *gin.Context, ctx context.Context, order Order, err error) {
	if order.IdempotencyKey != nil {
		var first Order
		// A read, safe without the lock.
		ferr := s.db.WithContext(context.WithoutCancel(ctx)).Where("idempotency_key = ?", *order.IdempotencyKey).Take(&first).Error
		if ferr == nil {
			if first.IdempotencyFP == nil || order.IdempotencyFP == nil || *first.IdempotencyFP != *order.IdempotencyFP {
				guard.AbortKeyReused(c)
				return
			}
			c.Header(guard.ReplayedHeader, "true")
			c.JSON(http.StatusCreated, first)
			return
		}
		if !errors.Is(ferr, gorm.ErrRecordNotFound) {
			s.internal(c, "find the order of an idempotency key", ferr)
			return
		}
	}
	var de *gormplugin.DuplicateError
	if errors.As(err, &de) && de.Index == indexUserSKU {
		ginmw.Abort(c, http.StatusConflict, "already_purchased")
		return
	}
	s.internal(c, "create the order", err)
}

// internal answers 500 and logs why.
func (s *Service) internal(c *gin.Context, what string, err error) {
	s.log.ErrorContext(c.Request.Context(), "seckill: "+what, "path", c.Request.URL.Path, "err", err)
	_ = c.Error(err)
	ginmw.Abort(c, http.StatusInternalServerError, "internal")
}

// admit runs before the lock on the purchase route: it refuses a request
// without a buyer, answers not_found for a SKU that does not exist, and
// sold_out for one whose stock is 0 (from memory once the instance has seen
// the SKU sell out, else from one read by the unique index), so that
// neither a made-up SKU nor the crowd arriving after the sale ever reaches
// the lock: a lock name (and its token counter in Redis) exists only for
// products that exist.
//
// A request that carries an Idempotency-Key from a buyer who holds an order
// goes on, though: it may be the retry of a purchase whose answer was lost,
// and the idempotency middleware replays that answer (the order), which
// sold_out would contradict.
func (s *Service) admit(c *gin.Context) {
	if c.Request.Method != http.MethodPost || c.FullPath() != routeBuy {
		return
	}
	user := c.GetString(userKey)
	if user == "" {
		ginmw.Abort(c, http.StatusBadRequest, "user_required", ginmw.Extra("detail", "send the buyer's id in X-User-ID"))
		return
	}
	sku := c.Param("sku")
	if !s.soldOut.known(sku) {
		var p Product
		err := s.db.WithContext(c.Request.Context()).Select("stock").Where("sku = ?", sku).Take(&p).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			ginmw.Abort(c, http.StatusNotFound, "not_found")
			return
		case err != nil || p.Stock > 0:
			// A failed read is left to the purchase, which reads again
			// under the lock and answers for itself.
			return
		}
		s.soldOut.mark(sku)
	}
	if c.GetHeader("Idempotency-Key") != "" {
		var n int64
		err := s.db.WithContext(c.Request.Context()).Model(&Order{}).Where("user_id = ? AND sku = ?", user, sku).Count(&n).Error
		if err != nil || n > 0 {
			return
		}
	}
	s.fast.Inc()
	ginmw.Abort(c, http.StatusConflict, "sold_out")
}

// soldOutFor is how long an instance trusts that a SKU is sold out before
// it looks again (through the lock): an admin reset on another instance is
// seen after at most this long.
const soldOutFor = time.Second

// soldOutMemory remembers the SKUs this instance has seen sold out.
type soldOutMemory struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (m *soldOutMemory) known(sku string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.until[sku]
	if ok && time.Now().After(t) {
		delete(m.until, sku)
		return false
	}
	return ok
}

func (m *soldOutMemory) mark(sku string) {
	m.mu.Lock()
	m.until[sku] = time.Now().Add(soldOutFor)
	m.mu.Unlock()
}

func (m *soldOutMemory) forget(sku string) {
	m.mu.Lock()
	delete(m.until, sku)
	m.mu.Unlock()
}
