package lock

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis Cluster's slot map, after a failover. go-redis routes each call
// by the slot map it loaded last, and reloads it by itself only when the
// map is older than its reload interval (10s) or when a node answers MOVED,
// which a master that died cannot: until then every call for that master's
// slots fails to dial it, although a replica has taken over. ReloadState
// only schedules a reload in the background. A call that could not dial its
// node was never sent, so it is safe to send again: the lock Client has the
// map reloaded, waits for the new one, and sends the call again. A call that
// may have been sent (a connection reset, a timeout) is not sent again here:
// it keeps going through the paths of an unknown outcome.

const (
	// redialFor is how long a script call that could not dial its Cluster
	// node is sent again at most when its context sets no earlier deadline:
	// about the time a Cluster with a short node timeout takes to promote a
	// replica. What goes on longer (a renewal, a final release, each bounded
	// by its hold's lease) is retried by its own path, every retry having
	// the map reloaded again.
	redialFor = 5 * time.Second
	// slotMapWait is how long a pipeline whose calls could not dial their
	// node waits for the reloaded slot map before sending them again once
	// (the watchdog retries what still fails).
	slotMapWait = 100 * time.Millisecond
)

// notSent reports whether err means the call never left: its node could not
// be dialled.
func notSent(err error) bool {
	if err == nil {
		return false // before op: the hot path allocates nothing here
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// awaitSlotMap has cc reload its slot map, after a call for key could not
// dial the node the map names for it, and waits until the map names another
// node for key, ctx ends or d has passed (the Cluster may not have promoted a
// replica yet: the map then comes back unchanged).
func awaitSlotMap(ctx context.Context, cc *redis.ClusterClient, key string, d time.Duration) {
	down := ""
	if node, err := cc.MasterForKey(ctx, key); err == nil {
		down = node.Options().Addr
	}
	cc.ReloadState(ctx)
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	// go-redis tells no one when its reload is done: look at the map
	// again every few milliseconds, for d at most.
	look := time.NewTicker(5 * time.Millisecond)
	defer look.Stop()
	for {
		select {
		case <-look.C:
			if node, err := cc.MasterForKey(ctx, key); err == nil && node.Options().Addr != down {
				return
			}
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
