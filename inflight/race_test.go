//go:build race

package inflight

// raceEnabled: the race detector slows every goroutine 5 to 20 times, so
// the tests of timing (handoff latency, occupancy under load) report their
// figures under it (make test runs with it), and check them in a run
// without it: go test -run 'TestHandoff|TestStressProcesses' ./inflight.
const raceEnabled = true
