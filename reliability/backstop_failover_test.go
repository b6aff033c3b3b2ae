package reliability_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// Product is a fenced row: the token of the newest lock holder that wrote it.
type Product struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

func TestFailover_StaleWriteOfTheHolderWhoseLockVanishedIsRefused(t *testing.T) {
	env := testenv.Sentinel(t)
	db, err := gorm.Open(mysql.Open(testenv.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		t.Cleanup(func() { sqlDB.Close() })
	}
	if err := db.Use(gormplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&Product{}); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if err := db.WithContext(bg).Create(&Product{SKU: "sku-42", Stock: 10}).Error; err != nil {
		t.Fatal(err)
	}
	newClient := func() *lock.Client {
		c := lock.New(env.FailoverClient(func(o *redis.FailoverOptions) { o.DialTimeout = 200 * time.Millisecond }),
			lock.WithWatchdogTimeout(6*time.Second))
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := newClient(), newClient()
	const name = "sku:42"
	decrement := func(ctx context.Context) error {
		return db.WithContext(ctx).Model(&Product{}).Where("sku = ?", "sku-42").
			Update("stock", gorm.Expr("stock - 1")).Error
	}

	// A holds the lock and writes under it.
	held, err := a.Mutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := decrement(held); err != nil {
		t.Fatal(err)
	}
	tokenA, _ := fencing.FromContext(held)

	// The replica never got A's lock (replication lag), and the master dies.
	if n := env.Master.Do("WAIT", 1, 2000); n != int64(1) {
		t.Fatalf("replica did not confirm: %v", n)
	}
	env.Replica.Do("CONFIG", "SET", "replica-read-only", "no")
	env.Replica.Do("DEL", name)
	env.Master.Kill()
	env.WaitForFailover(20 * time.Second)

	// B takes the lock on the new master and writes.
	taken, err := b.Mutex(name).TryLock(bg, 10*time.Second)
	if err != nil {
		t.Fatalf("B after the failover: %v", err)
	}
	if err := decrement(taken); err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// A, paused through all of this, writes with the token it holds: the
	// database refuses it instead of overselling.
	late := fencing.WithToken(context.WithoutCancel(held), tokenA)
	err = decrement(late)
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("A's late write = %v, want fencing.ErrStale", err)
	}
	var p Product
	if err := db.WithContext(bg).Where("sku = ?", "sku-42").First(&p).Error; err != nil {
		t.Fatal(err)
	}
	tokenB, _ := fencing.FromContext(taken)
	if p.Stock != 8 || p.Fence.Token() != tokenB {
		t.Fatalf("row = stock %d fence %d, want stock 8 fence %d (B's)", p.Stock, p.Fence, tokenB)
	}

	// And A learns that its lock vanished.
	select {
	case <-held.Done():
		if !errors.Is(context.Cause(held), lock.ErrLost) {
			t.Fatalf("A's cause = %v, want ErrLost", context.Cause(held))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A never learned that its lock vanished")
	}
	if err := decrement(held); err == nil {
		t.Fatal("A's write with its cancelled lock context went through")
	}
	b.Mutex(name).Unlock(taken)
}
