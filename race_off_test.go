//go:build !race

package leakybucket

// raceOn: the tests run under the race detector.
const raceOn = false
