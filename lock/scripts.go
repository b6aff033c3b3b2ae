package lock

import (
	"context"
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// loadScript returns the embedded script name with the shared helpers of
// lib.lua and of any further libraries in front of it.
func loadScript(name string, libs ...string) *redis.Script {
	src := ""
	for _, f := range append([]string{"lib.lua"}, append(libs, name)...) {
		b, err := scriptFiles.ReadFile("scripts/" + f)
		if err != nil {
			panic("lock: missing embedded script " + f)
		}
		src += string(b) + "\n"
	}
	return redis.NewScript(src)
}

var (
	acquireScript     = loadScript("acquire.lua")
	releaseScript     = loadScript("release.lua")
	renewScript       = loadScript("renew.lua")
	forceUnlockScript = loadScript("forceunlock.lua")
	transferScript    = loadScript("transfer.lua")
	raiseTokenScript  = loadScript("raise_token.lua")
	waitingScript     = loadScript("waiting.lua")

	fairAcquireScript = loadScript("fair_acquire.lua", "fairlib.lua")
	fairReleaseScript = loadScript("fair_release.lua", "fairlib.lua")
	fairLeaveScript   = loadScript("fair_leave.lua", "fairlib.lua")

	readAcquireScript  = loadScript("read_acquire.lua", "rwlib.lua")
	readReleaseScript  = loadScript("read_release.lua", "rwlib.lua")
	readRenewScript    = loadScript("read_renew.lua")
	writeAcquireScript = loadScript("write_acquire.lua", "rwlib.lua")
	writeReleaseScript = loadScript("write_release.lua", "rwlib.lua")
	writeLeaveScript   = loadScript("write_leave.lua", "rwlib.lua")

	multiAcquireScript = loadScript("multi_acquire.lua")
	multiReleaseScript = loadScript("multi_release.lua")

	permitAcquireScript = loadScript("permit_acquire.lua")
	permitReleaseScript = loadScript("permit_release.lua")
	permitRenewScript   = loadScript("permit_renew.lua")
)

// run sends s with EVALSHA. A server that does not know the script (restarted,
// failed over, SCRIPT FLUSH) answers NOSCRIPT once; the script is then sent
// whole with EVAL, which caches it again.
func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return s.Run(ctx, c.rdb, keys, args...)
}
