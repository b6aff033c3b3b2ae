package gormplugin_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// A fenced write whose lock context is cancelled (the lock was lost) while
// the write is on its way is either applied or refused with an error
// matching fencing.ErrStale and the cause — never another error, whatever
// the driver made of the cancellation.
func TestRefuseLate_WriteCancelledOnItsWayIsStale(t *testing.T) {
	db, _ := open(t)
	p := seed(t, db, "sku-1", 1000, 0)
	for i := range 200 {
		ctx, cancel := context.WithCancelCause(at(fencing.Token(i + 1)))
		go func() {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			cancel(errLost)
		}()
		err := db.WithContext(ctx).Model(&Product{ID: p.ID}).Update("stock", 1000-i).Error
		if err != nil && (!errors.Is(err, fencing.ErrStale) || !errors.Is(err, errLost)) {
			t.Fatalf("write %d cancelled on its way: %v, want fencing.ErrStale and the cause", i, err)
		}
		cancel(nil)
	}
}
