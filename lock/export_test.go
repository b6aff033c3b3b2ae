package lock

import (
	"context"
	"fmt"
)

// HoldsOf returns how many holds c keeps registered: held ones, and ones an
// operation in progress uses. The model test (model_test.go) requires 0
// once everything it took has been released.
func HoldsOf(c *Client) int {
	return c.holds.size()
}

// DescribeHolds describes the holds c keeps registered, for a test's
// failure message.
func DescribeHolds(c *Client) []string {
	c.holds.mu.Lock()
	defer c.holds.mu.Unlock()
	var out []string
	for id, h := range c.holds.m {
		out = append(out, fmt.Sprintf("%s role %d owner %d: refs %d pinned %v lost %v kind %T",
			id.key, id.role, id.owner, h.refs, h.pinned, h.lost, h.kind))
	}
	return out
}

// RenewScriptSHA is the SHA1 the watchdog's renewals of exclusive holds
// are sent under (EVALSHA), for a test that picks them out of the
// traffic.
func RenewScriptSHA() string { return renewScript.Hash() }

// ReleaseScriptSHA is the SHA1 a Mutex's releases (and the rollback of what
// a lost hold may have left) are sent under.
func ReleaseScriptSHA() string { return releaseScript.Hash() }

// DelayGrants makes every waiter that was handed a lock run wake first
// before it takes the lock, as a goroutine the scheduler leaves waiting
// would, until the returned func restores the default. Not for parallel
// tests.
func DelayGrants(wake func()) (restore func()) {
	takingGrant = wake
	return func() { takingGrant = nil }
}

// WatchdogKicks returns how many times c's watchdog loop was woken because
// a hold was added (see watchdog.enlist).
func WatchdogKicks(c *Client) int64 { return c.dog.kicks.Load() }

// TokenBlock is how many fencing tokens a Mutex's acquisition reserves, its
// own included.
const TokenBlock = tokenBlock

// ForeignWaiters counts, as a Client does at the end of a turn, the
// subscribers of the unlock channel of c's Mutex name that are not Clients
// of this package (see markChannel), and returns the count c recorded.
func ForeignWaiters(c *Client, name string) int64 {
	ch := c.Mutex(name).unlockCh
	c.countOthers(context.Background(), ch)
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if r := c.runs[ch]; r != nil {
		return r.foreign
	}
	return 0
}
