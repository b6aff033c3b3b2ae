package lock

import (
	"context"
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// loadScript returns the embedded script name assembled with the libraries
// libs: their text in front of the script's, in the order given, so that
// the script is still one EVALSHA. Each script below names every library it
// uses; nothing is added to it that it does not name (a library it does not
// call costs Lua the building of its helpers on every call). A library name
// that is not embedded panics when the package loads.
//
// Redis reports the line of a script error counting from the first line of
// the assembled text, libraries included: subtract their lengths to find the
// line in the script's own file.
func loadScript(name string, libs ...string) *redis.Script {
	src := ""
	for _, f := range append(libs, name) {
		src += embeddedScript(f) + "\n"
	}
	return redis.NewScript(src)
}

// embeddedScript returns the text of scripts/name.
func embeddedScript(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic("lock: missing embedded script " + name)
	}
	return string(b)
}

// The scripts, each with the libraries it is assembled with. lib.lua (the
// clock, fencing tokens, the replication mode) comes first wherever it is
// used; fairlib.lua and rwlib.lua hold what the scripts of one kind share
// and use lib.lua's clock.
var (
	acquireScript     = loadScript("acquire.lua", "lib.lua")
	releaseScript     = loadScript("release.lua")
	renewScript       = loadScript("renew.lua")
	forceUnlockScript = loadScript("forceunlock.lua")
	transferScript    = loadScript("transfer.lua", "lib.lua")
	raiseTokenScript  = loadScript("raise_token.lua", "lib.lua")
	waitingScript     = loadScript("waiting.lua", "lib.lua")

	fairAcquireScript = loadScript("fair_acquire.lua", "lib.lua", "fairlib.lua")
	fairReleaseScript = loadScript("fair_release.lua", "lib.lua", "fairlib.lua")
	fairLeaveScript   = loadScript("fair_leave.lua", "lib.lua", "fairlib.lua")

	readAcquireScript  = loadScript("read_acquire.lua", "lib.lua", "rwlib.lua")
	readReleaseScript  = loadScript("read_release.lua", "lib.lua", "rwlib.lua", "rwrelease.lua")
	readRenewScript    = loadScript("read_renew.lua", "lib.lua")
	writeAcquireScript = loadScript("write_acquire.lua", "lib.lua", "rwlib.lua")
	writeReleaseScript = loadScript("write_release.lua", "lib.lua", "rwlib.lua", "rwrelease.lua")
	writeLeaveScript   = loadScript("write_leave.lua", "lib.lua", "rwlib.lua")

	multiAcquireScript = loadScript("multi_acquire.lua", "lib.lua")
	multiReleaseScript = loadScript("multi_release.lua")

	permitAcquireScript = loadScript("permit_acquire.lua", "lib.lua")
	permitReleaseScript = loadScript("permit_release.lua")
	permitRenewScript   = loadScript("permit_renew.lua", "lib.lua")

	inspectScript = loadScript("inspect.lua", "lib.lua")
)

// run sends s with EVALSHA. A server that does not know the script (restarted,
// failed over, SCRIPT FLUSH) answers NOSCRIPT once; the script is then sent
// whole with EVAL, which caches it again.
func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return s.Run(ctx, c.rdb, keys, args...)
}
