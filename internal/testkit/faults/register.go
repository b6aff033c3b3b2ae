package faults

import (
	"context"
	"errors"
	"fmt"

	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/gormplugin"
)

// Register is the resource the fault scenarios protect: one integer per
// name in MariaDB. Holders read it under a lock and write back what they
// read plus one, so that every lost update shows in the history. Its fence
// column makes gormplugin refuse the writes of a holder whose lock a newer
// holder has taken over.
type Register struct {
	Name  string `gorm:"primaryKey;size:191"`
	Value int64
	Fence gormplugin.Fence
}

// unfencedRegister is Register seen by a model that never declared the
// fence column: its writes to the same rows are not fenced. Scenarios use it
// to show what the checker finds when the database backstop is missing.
type unfencedRegister struct {
	Name  string `gorm:"primaryKey;size:191"`
	Value int64
}

func (unfencedRegister) TableName() string { return "registers" }

// OpenDB connects to the MariaDB database dsn with gormplugin installed.
// It sets clientFoundRows, as gormplugin recommends, and logs nothing.
func OpenDB(dsn string) (*gorm.DB, error) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("faults: dsn: %w", err)
	}
	cfg.ClientFoundRows = true
	cfg.ParseTime = true
	db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("faults: open database: %w", err)
	}
	if err := db.Use(gormplugin.New()); err != nil {
		return nil, fmt.Errorf("faults: install gormplugin: %w", err)
	}
	// Keep the connections it opens: database/sql keeps two idle ones by
	// default, and concurrent holders would otherwise redial per statement.
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.SetMaxOpenConns(16)
		sqlDB.SetMaxIdleConns(16)
	}
	return db, nil
}

// SeedRegisters creates the registers table and a register of value 0 for
// each name.
func SeedRegisters(db *gorm.DB, names ...string) error {
	if err := db.AutoMigrate(&Register{}); err != nil {
		return fmt.Errorf("faults: migrate registers: %w", err)
	}
	for _, n := range names {
		if err := db.Create(&Register{Name: n}).Error; err != nil {
			return fmt.Errorf("faults: seed register %q: %w", n, err)
		}
	}
	return nil
}

// ReadRegister returns the value of register name.
func ReadRegister(ctx context.Context, db *gorm.DB, name string) (int64, error) {
	var r Register
	if err := db.WithContext(ctx).Take(&r, "name = ?", name).Error; err != nil {
		return 0, fmt.Errorf("faults: read register %q: %w", name, err)
	}
	return r.Value, nil
}

// ErrNoRegister is returned by WriteRegister for a name that was not seeded.
var ErrNoRegister = errors.New("faults: no such register")

// WriteRegister sets register name to value with ctx, which carries the
// writer's fencing token when it holds a lock. With fenced false the write
// goes through a model without the fence column, as an application that did
// not opt into fencing would write. A refused write matches fencing.ErrStale.
func WriteRegister(ctx context.Context, db *gorm.DB, name string, value int64, fenced bool) error {
	var res *gorm.DB
	if fenced {
		res = db.WithContext(ctx).Model(&Register{Name: name}).Update("value", value)
	} else {
		res = db.WithContext(ctx).Model(&unfencedRegister{Name: name}).Update("value", value)
	}
	if res.Error != nil {
		return fmt.Errorf("faults: write register %q: %w", name, res.Error)
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: %q", ErrNoRegister, name)
	}
	return nil
}

// RegisterValues returns the value of every register.
func RegisterValues(db *gorm.DB) (map[string]int64, error) {
	var rs []Register
	if err := db.Find(&rs).Error; err != nil {
		return nil, fmt.Errorf("faults: read registers: %w", err)
	}
	out := make(map[string]int64, len(rs))
	for _, r := range rs {
		out[r.Name] = r.Value
	}
	return out, nil
}

// RegisterFences returns the fence (the token that wrote it last) of every
// register.
func RegisterFences(db *gorm.DB) (map[string]int64, error) {
	var rs []Register
	if err := db.Find(&rs).Error; err != nil {
		return nil, fmt.Errorf("faults: read registers: %w", err)
	}
	out := make(map[string]int64, len(rs))
	for _, r := range rs {
		out[r.Name] = int64(r.Fence.Token())
	}
	return out, nil
}
