package lock

import (
	"fmt"
	"strings"
)

// Redisson's prefixes for the keys and channels derived from a lock name.
const (
	channelPrefix = "redisson_lock__channel"
	tokenPrefix   = "redisson_lock_token"
)

// derived names a key or channel that belongs to the lock called name, the way
// Redisson does: the name is wrapped in braces so that both hash to the same
// Cluster slot, unless it already carries a hash tag.
func derived(prefix, name string) string {
	if strings.Contains(name, "{") {
		return prefix + ":" + name
	}
	return prefix + ":{" + name + "}"
}

// checkName rejects names that cannot be a lock: empty ones, and ones whose
// derived keys and channels would land in another Cluster slot than the lock
// itself — a "{" that does not open a non-empty hash tag, or a "}" before
// the first "{" (Redis takes "a}b" whole, its derived names by "{a}b}").
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty lock name", ErrInvalid)
	}
	if i := strings.IndexByte(name, '{'); i >= 0 {
		j := strings.IndexByte(name[i+1:], '}')
		if j <= 0 {
			return fmt.Errorf("%w: lock name %q has a \"{\" without a non-empty hash tag \"{...}\"", ErrInvalid, name)
		}
	}
	if slot(derived(tokenPrefix, name)) != slot(name) {
		return fmt.Errorf("%w: lock name %q: its derived keys would fall in another Cluster slot; use a hash tag \"{...}\" or no braces", ErrInvalid, name)
	}
	return nil
}

// slot returns the Redis Cluster hash slot of key.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Redisson's names for a fair lock's wait line, and the key of ours beside
// it (see fairlib.lua).
const (
	queuePrefix   = "redisson_lock_queue"
	timeoutPrefix = "redisson_lock_timeout"
	alivePrefix   = "seckillguard_fair_alive" // our waiters' liveness; Redisson never reads it
	waitPrefix    = "seckillguard_fair_wait"  // our waiters' waits; likewise
)

// markPrefix names the mark of an unlock channel (see markChannel). A
// prefix, so that no pattern of Redisson's channel names matches a mark, and
// without a brace, so that the channel's hash tag is the mark's.
const markPrefix = "seckillguard_waits:"

// markChannel returns the channel this package's Clients subscribe to
// beside channel, and that nothing is published on: the number of its
// subscribers is the number of the package's Clients among channel's. It is
// in channel's hash slot when channel's name has a hash tag; it returns ""
// when it has none in a Cluster (the two could not be subscribed to in one
// command there, and every subscriber then counts as a Client of ours).
func markChannel(channel string, cluster bool) string {
	if cluster {
		open := strings.IndexByte(channel, '{')
		if open < 0 || strings.IndexByte(channel[open+1:], '}') <= 0 {
			return ""
		}
	}
	return markPrefix + channel
}
