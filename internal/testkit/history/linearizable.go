package history

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// linearizeTimeout bounds porcupine's search. Lock-protected histories are
// nearly sequential and check in milliseconds; a history that needs longer
// is reported as unknown rather than stalling the suite.
const linearizeTimeout = 10 * time.Second

// rmw is one accepted read-modify-write as porcupine sees it.
type rmw struct {
	key         string
	read, value int64
	initial     int64
}

// registerModel is a register per key on which a read-modify-write that
// read r and wrote v is a legal step exactly when the register holds r.
var registerModel = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := make(map[string][]porcupine.Operation)
		var keys []string
		for _, op := range ops {
			k := op.Input.(rmw).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return int64(-1 << 62) }, // replaced by the key's initial value at the first step
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(int64), input.(rmw)
		if s == -1<<62 {
			s = in.initial
		}
		if s != in.read {
			return false, state
		}
		return true, in.value
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(rmw)
		return fmt.Sprintf("%s: read %d, wrote %d", in.key, in.read, in.value)
	},
}

// linearizable checks the accepted writes as read-modify-write operations
// spanning from the read being sent to the write's outcome. It returns the
// keys whose operations are not linearizable, and whether the check ran out
// of time.
func linearizable(ws []Write, initial map[string]int64) (bad []string, unknown bool) {
	var ops []porcupine.Operation
	for _, w := range ws {
		if !w.Accepted {
			continue
		}
		call := w.ReadAt
		if call.IsZero() || call.After(w.Start) {
			call = w.Start
		}
		ops = append(ops, porcupine.Operation{
			Input:  rmw{key: w.Key, read: w.Read, value: w.Value, initial: initial[w.Key]},
			Call:   call.UnixNano(),
			Return: w.End.UnixNano(),
		})
	}
	if len(ops) == 0 {
		return nil, false
	}
	for _, part := range registerModel.Partition(ops) {
		switch porcupine.CheckOperationsTimeout(registerModel, part, linearizeTimeout) {
		case porcupine.Illegal:
			bad = append(bad, part[0].Input.(rmw).key)
		case porcupine.Unknown:
			unknown = true
		}
	}
	return bad, unknown
}
