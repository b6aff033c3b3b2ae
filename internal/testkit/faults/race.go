//go:build race

package faults

// raceEnabled reports whether this binary runs under the race detector;
// Build then builds the binaries it runs the same way.
const raceEnabled = true
