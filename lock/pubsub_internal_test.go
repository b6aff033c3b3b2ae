package lock

import (
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// The reply to a Client's own SUNSUBSCRIBE of a channel may arrive after a
// new waiter has started subscribing it again (its SSUBSCRIBE waits for the
// SUNSUBSCRIBE to go out, not for its reply): it must not be taken for the
// server dropping the new subscription, whose connection is not even known
// yet. The model test's Cluster variant crashed on it (a nil connection).
func TestSubscriber_ReplyToItsOwnUnsubscribeDropsNothing(t *testing.T) {
	srv := testenv.Redis(t)
	c := New(srv.Client())
	defer c.Close()
	old := &psConn{sharded: true}
	cs := &chanSub{channel: "redisson_lock__channel:{internal:drop}", refs: 1, ready: make(chan struct{})}
	c.subs.mu.Lock()
	c.subs.chans[cs.channel] = cs
	c.subs.mu.Unlock()

	c.subs.dropped(old, cs.channel) // the reply to the earlier subscription's SUNSUBSCRIBE

	c.subs.mu.Lock()
	defer c.subs.mu.Unlock()
	if c.subs.chans[cs.channel] != cs {
		t.Fatal("the new subscription was forgotten for the reply to the old one's unsubscribe")
	}
}
