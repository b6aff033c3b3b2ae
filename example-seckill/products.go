package main

import (
	"context"
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"
	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/gormplugin"
)

// product answers the SKU's current state.
func (s *Service) product(c *gin.Context) {
	var p Product
	err := s.db.WithContext(c.Request.Context()).Where("sku = ?", c.Param("sku")).Take(&p).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		ginmw.Abort(c, http.StatusNotFound, "not_found")
	case err != nil:
		s.internal(c, "read the product", err)
	default:
		c.JSON(http.StatusOK, p)
	}
}

// productInput is the body of POST /api/admin/products.
type productInput struct {
	SKU   string `json:"sku"`
	Name  string `json:"name"`
	Stock *int   `json:"stock"`
	Price int64  `json:"price"`
}

// putProduct creates a product, or resets one: name, stock and price are
// replaced and the SKU's orders deleted, so that a sale can be run again
// (the demo does, once per mode). 201 when created, 200 when reset. The
// policy file locks it on the SKU like a purchase, so a reset never
// interleaves with a sale's read-and-write.
//
// It has no authentication: this is a demo service, not for the internet.
func (s *Service) putProduct(c *gin.Context) {
	var in productInput
	if err := c.ShouldBindJSON(&in); err != nil {
		ginmw.Abort(c, http.StatusBadRequest, "bad_body", ginmw.Extra("detail", err.Error()))
		return
	}
	switch {
	case !validID(in.SKU):
		ginmw.Abort(c, http.StatusBadRequest, "bad_sku", ginmw.Extra("detail", "sku: 1 to 64 letters, digits and . _ : -"))
		return
	case in.Stock == nil || *in.Stock < 0:
		ginmw.Abort(c, http.StatusBadRequest, "bad_stock", ginmw.Extra("detail", "stock: a number >= 0"))
		return
	case in.Price < 0 || len(in.Name) > 255:
		ginmw.Abort(c, http.StatusBadRequest, "bad_product", ginmw.Extra("detail", "price >= 0, name up to 255 bytes"))
		return
	}
	ctx := c.Request.Context()
	p := Product{SKU: in.SKU, Name: in.Name, Stock: *in.Stock, Price: in.Price}
	var (
		created bool
		err     error
	)
	for attempt := 0; attempt < 3; attempt++ {
		// A reset runs while purchases of the SKU may (without the lock)
		// update its row and insert orders: the database may pick it as a
		// deadlock's victim, rolled back, which simply runs again.
		if created, err = s.writeProduct(ctx, p); !isDeadlock(err) {
			break
		}
	}
	switch {
	case err == nil:
		s.soldOut.forget(p.SKU)
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		c.JSON(status, p)
	case s.refused(c, ctx, err):
	default:
		s.internal(c, "write the product", err)
	}
}

// writeProduct creates p, or resets the product of its SKU when there is one,
// and reports whether it created it.
//
// The INSERT comes first, on its own. Inserts of different new SKUs never
// wait for each other; an UPDATE that matches no row, the other order,
// takes a gap lock on the unique index, and two creations that each hold
// one deadlock on their INSERTs: of 32 creations at once on MariaDB, up to
// nearly all were rolled back that way.
func (s *Service) writeProduct(ctx context.Context, p Product) (created bool, err error) {
	err = s.db.WithContext(ctx).Create(&p).Error
	if !errors.Is(err, gormplugin.ErrDuplicate) {
		return err == nil, err
	}
	return false, s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Product{}).Where("sku = ?", p.SKU).
			Updates(map[string]any{"name": p.Name, "stock": p.Stock, "price": p.Price})
		switch {
		case res.Error != nil:
			return res.Error
		case res.RowsAffected == 0:
			// Rows matched, not changed, are counted (clientFoundRows):
			// the row the INSERT found is gone, which this service never
			// does.
			return errors.New("the product disappeared while it was reset")
		}
		return tx.Where("sku = ?", p.SKU).Delete(&Order{}).Error
	})
}

// isDeadlock reports whether err is MySQL's "Deadlock found" (1213), after
// which the transaction was rolled back and may run again.
func isDeadlock(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}
