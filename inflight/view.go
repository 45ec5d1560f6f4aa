package inflight

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A view is this process's picture of Redis's line and room for one
// resource: what its first waiter's last look saw, brought up to date by
// the messages every process publishes as the line changes. A release
// adds the weight it freed; a ticket that leaves the line, or passes to
// its process's next waiter, says so, with the weight it took if it was
// admitted. From the view a waiter reckons, without a round trip, whether
// its weight fits behind the tickets ahead of it, and tries only then.
// The view is an estimate (a message may cross a look): Redis's
// transaction decides, exactly, and a waiter whose reckoning was wrong is
// refused and looks again.
type view struct {
	room int      // the weight that fits under every limit
	line []placed // the tickets in line, in order of arrival
}

// placed is a ticket in line.
type placed struct {
	id      string
	arrival float64
	weight  int
}

// viewOf is the view of a look that saw res.
func viewOf(res attemptResult) *view {
	v := &view{room: res.room}
	for i, id := range res.line.ids {
		v.line = append(v.line, placed{id: id, arrival: res.line.arrivals[i], weight: res.line.weights[id]})
	}
	return v
}

// fits reports whether weight n, of the ticket id arriving at arrival,
// fits in the room behind the tickets that arrived before it.
func (v *view) fits(id string, arrival float64, n int) bool {
	ahead := 0
	for _, p := range v.line {
		if p.id != id && before(p, id, arrival) {
			ahead += p.weight
		}
	}
	return v.room-ahead >= n
}

// before reports whether p ranks before the ticket id arriving at
// arrival, as Redis ranks equal scores: by member.
func before(p placed, id string, arrival float64) bool {
	return p.arrival < arrival || (p.arrival == arrival && p.id < id)
}

// A move is a ticket leaving its place: dropped, or passed to its
// process's next waiter (to: its arrival and weight). The weight its
// waiter took, if admitted, was told by its write's message.
type move struct {
	from string // the process that sent it
	id   string
	to   *placed
}

// moved applies m: again, it changes nothing.
func (v *view) moved(m move) {
	v.line = slices.DeleteFunc(v.line, func(p placed) bool { return p.id == m.id })
	if m.to != nil {
		i, _ := slices.BinarySearchFunc(v.line, *m.to, func(p, q placed) int {
			if before(p, q.id, q.arrival) {
				return -1
			}
			return 1
		})
		v.line = slices.Insert(v.line, i, *m.to)
	}
}

// The messages on a resource's channel: a release is the weight it
// freed ("3"); an attempt's is "l" (a look) or "w" (a write, with its
// weight, taken until told otherwise), with the sender's process and the
// attempt's number there; a move is "m" and its fields; a take-back is takenBack: a write was
// refused, and room it held for a moment is free again, by an amount no
// one knows, so every waiter in line looks.
//
// Redis sends a channel's messages to each subscriber in the order they
// were published, and an attempt publishes its own after its reads, in
// its transaction: a process hears, before its attempt's own message,
// exactly the messages its reads saw the effect of, and after it, those
// they did not. So its view is the look's, and the messages after.
const takenBack = "+"

// An attempt's message: its process, its number there, and the weight it
// writes (0 for a look).
type attemptMsg struct {
	from string
	seq  uint64
	n    int
}

func (m attemptMsg) String() string {
	if m.n == 0 {
		return fmt.Sprintf("l %s %d", m.from, m.seq)
	}
	return fmt.Sprintf("w %s %d %d", m.from, m.seq, m.n)
}

// parseAttempt decodes an attempt's message; false if it is none.
func parseAttempt(msg string) (attemptMsg, bool) {
	f := strings.Fields(msg)
	if len(f) < 3 || (f[0] != "l" || len(f) != 3) && (f[0] != "w" || len(f) != 4) {
		return attemptMsg{}, false
	}
	m := attemptMsg{from: f[1]}
	var err error
	if m.seq, err = strconv.ParseUint(f[2], 10, 64); err != nil {
		return attemptMsg{}, false
	}
	if len(f) == 4 {
		if m.n, err = strconv.Atoi(f[3]); err != nil {
			return attemptMsg{}, false
		}
	}
	return m, true
}

// String encodes m as a message.
func (m move) String() string {
	s := fmt.Sprintf("m %s %s", m.from, m.id)
	if m.to != nil {
		s += fmt.Sprintf(" %s %d", strconv.FormatFloat(m.to.arrival, 'g', -1, 64), m.to.weight)
	}
	return s
}

// parseMove decodes a move's message; false if it is none.
func parseMove(msg string) (move, bool) {
	f := strings.Fields(msg)
	if len(f) != 3 && len(f) != 5 || f[0] != "m" {
		return move{}, false
	}
	m := move{from: f[1], id: f[2]}
	if len(f) == 5 {
		to := placed{id: f[2]}
		arrival, err1 := strconv.ParseFloat(f[3], 64)
		weight, err2 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil {
			return move{}, false
		}
		to.arrival, to.weight = arrival, weight
		m.to = &to
	}
	return m, true
}
