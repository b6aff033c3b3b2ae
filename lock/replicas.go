package lock

import (
	"fmt"
	"time"
)

// A replicaAck asks each first acquisition to be confirmed by replicas.
type replicaAck struct {
	replicas int           // 0 = no acknowledgement
	timeout  time.Duration // WAIT's timeout
}

func newReplicaAck(replicas int, timeout time.Duration) (replicaAck, error) {
	switch {
	case replicas < 0:
		return replicaAck{}, fmt.Errorf("%w: %d replicas, want 0 or more", ErrInvalid, replicas)
	case replicas > 0 && timeout <= 0:
		return replicaAck{}, fmt.Errorf("%w: replica acknowledgement timeout %v, want a positive duration (WAIT 0 would block forever)", ErrInvalid, timeout)
	}
	return replicaAck{replicas: replicas, timeout: timeout}, nil
}

// WithReplicaAck makes every first acquisition by the Client wait until
// replicas replicas have confirmed it (Redis WAIT), for at most timeout. An
// acquisition that fewer replicas confirm is undone and fails with
// ErrNotReplicated, so a lock is never held on the master alone where a
// failover would lose it. Re-entries, renewals and releases do not wait.
// Default: 0 replicas, no acknowledgement; WithReplicas overrides it for one
// acquisition.
//
// Redisson's equivalent fails only when no replica at all confirms; here the
// number is yours. Acknowledgement narrows the failover window, it does not
// close it: a replica that confirmed may still not be the one promoted. Fence
// the writes.
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(o *clientOptions) {
		ack, err := newReplicaAck(replicas, timeout)
		if err != nil {
			o.err = err
			return
		}
		o.ack = ack
	}
}

// WithReplicas is WithReplicaAck for one acquisition: it waits until replicas
// replicas have confirmed it, for at most timeout, and fails with
// ErrNotReplicated (having undone the acquisition) when fewer do. replicas 0
// turns a Client's default acknowledgement off. Default: the Client's
// WithReplicaAck setting.
func WithReplicas(replicas int, timeout time.Duration) LockOption {
	return func(o *lockOptions) {
		ack, err := newReplicaAck(replicas, timeout)
		if err != nil {
			o.err = err
			return
		}
		o.ack = ack
	}
}
