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
