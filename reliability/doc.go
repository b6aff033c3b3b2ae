// Package reliability is the fault, pause and hostile-input suite of
// seckillguard. It has no API: its tests run the failures a Redis lock
// meets in production — a holder frozen past its lease, Redis restarted empty, a slow
// and lossy network, a Sentinel failover, a service instance paused mid-sale,
// clients churning — and hostile requests, against real redis-server,
// Sentinel and MariaDB processes, and check the recorded histories with
// package internal/history. docs/RELIABILITY.md maps each guarantee to the
// test that shows it.
package reliability
