package gormplugin_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Product is the fenced row of most tests.
type Product struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

// Order has two unique indexes that a handler must tell apart.
type Order struct {
	ID      uint
	UserID  uint   `gorm:"uniqueIndex:idx_user_sku"`
	SKU     string `gorm:"size:64;uniqueIndex:idx_user_sku"`
	IdemKey string `gorm:"size:64;uniqueIndex:idx_idem_key"`
	Fence   gormplugin.Fence
}

// Account has a renamed fence column and soft delete.
type Account struct {
	ID        uint
	Balance   int
	Fence     gormplugin.Fence `gorm:"column:lock_token"`
	DeletedAt gorm.DeletedAt
}

// Ledger has no fence column.
type Ledger struct {
	ID   uint
	Note string `gorm:"size:64"`
}

var models = []any{&Product{}, &Order{}, &Account{}, &Ledger{}}

// errLost stands in for lock.ErrLost, the cause a lock cancels its context
// with when the lock is lost.
var errLost = errors.New("lock: lost")

// at returns a context carrying token t.
func at(t fencing.Token) context.Context {
	return fencing.WithToken(context.Background(), t)
}

// queryLog records every statement GORM sends, with its arguments inlined.
type queryLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *queryLog) LogMode(logger.LogLevel) logger.Interface { return l }
func (l *queryLog) Info(context.Context, string, ...any)     {}
func (l *queryLog) Warn(context.Context, string, ...any)     {}
func (l *queryLog) Error(context.Context, string, ...any)    {}

func (l *queryLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.mu.Lock()
	l.sqls = append(l.sqls, sql)
	l.mu.Unlock()
}

// take returns the statements logged since the last take and forgets them.
func (l *queryLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sqls
	l.sqls = nil
	return s
}

// fixedNow keeps timestamps (soft delete) equal between two databases.
func fixedNow() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }

// open connects to a fresh database with the plugin installed and the test
// models migrated.
func open(t *testing.T, opts ...gormplugin.Option) (*gorm.DB, *queryLog) {
	t.Helper()
	return openWith(t, testenv.MySQL(t), gormplugin.New(opts...), &gorm.Config{})
}

// openWith connects to dsn with cfg, installs plugin unless it is nil, and
// migrates the test models.
func openWith(t *testing.T, dsn string, plugin gorm.Plugin, cfg *gorm.Config) (*gorm.DB, *queryLog) {
	t.Helper()
	log := &queryLog{}
	cfg.Logger = log
	if cfg.NowFunc == nil {
		cfg.NowFunc = fixedNow
	}
	db, err := gorm.Open(mysql.Open(dsn), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	if plugin != nil {
		if err := db.Use(plugin); err != nil {
			t.Fatalf("use plugin: %v", err)
		}
	}
	if err := db.AutoMigrate(models...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	log.take()
	return db, log
}

// withFoundRows returns dsn with clientFoundRows=true.
func withFoundRows(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	return cfg.FormatDSN()
}

// seed inserts a product without a token and then stamps it with fence.
func seed(t *testing.T, db *gorm.DB, sku string, stock int, fence fencing.Token) Product {
	t.Helper()
	p := Product{SKU: sku, Stock: stock}
	if err := db.Create(&p).Error; err != nil {
		t.Fatalf("seed %s: %v", sku, err)
	}
	if fence > 0 {
		if err := db.Model(&Product{}).Where("id = ?", p.ID).UpdateColumn("fence", fence).Error; err != nil {
			t.Fatalf("seed fence %s: %v", sku, err)
		}
		p.Fence = gormplugin.Fence(fence)
	}
	return p
}

// load reads a product by id without a token, soft-deleted rows included.
func load(t *testing.T, db *gorm.DB, id uint) Product {
	t.Helper()
	var p Product
	if err := db.Unscoped().First(&p, id).Error; err != nil {
		t.Fatalf("load product %d: %v", id, err)
	}
	return p
}

// wantStale fails unless err is a stale-token rejection of token against
// current on table, naming key.
func wantStale(t *testing.T, err error, table, key string, token, current fencing.Token) {
	t.Helper()
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("err = %v, want fencing.ErrStale", err)
	}
	var se *fencing.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("err = %T %v, want a *fencing.StaleError", err, err)
	}
	if se.Resource != table || se.Key != key || se.Token != token || se.Current != current {
		t.Errorf("stale error = %+v, want table %q key %q token %d current %d", *se, table, key, token, current)
	}
	for _, part := range []string{table, key, token.String(), current.String()} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("message %q does not name %q", err.Error(), part)
		}
	}
}

// wantRow fails unless the product has the given stock and fence.
func wantRow(t *testing.T, db *gorm.DB, id uint, stock int, fence fencing.Token) {
	t.Helper()
	p := load(t, db, id)
	if p.Stock != stock || p.Fence.Token() != fence {
		t.Fatalf("product %d: stock %d fence %d, want stock %d fence %d", id, p.Stock, p.Fence, stock, fence)
	}
}

// countSelects counts the statements that are SELECTs.
func countSelects(sqls []string) int {
	n := 0
	for _, s := range sqls {
		if strings.HasPrefix(s, "SELECT") {
			n++
		}
	}
	return n
}
