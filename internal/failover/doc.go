// Package failover holds end-to-end tests of the lock and the database
// backstop together: a Redis failover loses a lock, and the database refuses
// the write its former holder makes with the stale fencing token. It has no
// code of its own; it exists because neither lock nor gormplugin may import
// the other.
package failover
