//go:build !race

package inflight

const raceEnabled = false
