package inflight

import (
	"math"
	"testing"
)

// A view reckons a waiter's room behind the tickets that arrived before
// it, as Redis's transaction judges it, and keeps up with the messages.
func TestView(t *testing.T) {
	v := &view{room: 4, line: []placed{{id: "a", arrival: 10, weight: 3}, {id: "b", arrival: 20, weight: 2}}}
	for _, c := range []struct {
		id      string
		arrival float64
		n       int
		want    bool
	}{
		{"a", 10, 3, true},  // first: all the room is its
		{"a", 10, 5, false}, // more than the room
		{"b", 20, 1, true},  // 4 - 3 ahead
		{"b", 20, 2, false}, // 4 - 3 ahead < 2
		{"c", 15, 1, true},  // between a and b: only a is ahead
		{"c", 20, 1, false}, // equal arrivals rank by id, as Redis ranks them: b is ahead too
		{"", math.Inf(1), 1, false},
	} {
		if got := v.fits(c.id, c.arrival, c.n); got != c.want {
			t.Errorf("fits(%q, %v, %d) = %v, want %v", c.id, c.arrival, c.n, got, c.want)
		}
	}

	v.room -= 3                                                          // a admitted with 3 (its write's message)
	v.moved(move{id: "a", to: &placed{id: "a", arrival: 30, weight: 1}}) // and passed on, behind b
	v.moved(move{id: "a", to: &placed{id: "a", arrival: 30, weight: 1}}) // told twice: no change
	if v.room != 1 || len(v.line) != 2 || v.line[0].id != "b" || v.line[1].id != "a" {
		t.Fatalf("after a's move: %+v", v)
	}
	if !v.fits("b", 20, 1) || v.fits("b", 20, 2) || v.fits("a", 30, 1) {
		t.Errorf("after a's move: fits wrong in %+v", v)
	}
	v.moved(move{id: "b"}) // b gave up, dropped
	if len(v.line) != 1 || !v.fits("a", 30, 1) {
		t.Errorf("after b's drop: %+v", v)
	}
}

// Every message a process sends reads back as sent, and nothing else
// reads as one.
func TestViewMessages(t *testing.T) {
	for _, m := range []move{
		{from: "p", id: "t"},
		{from: "p", id: "t", to: &placed{id: "t", arrival: 1796698545229.0009765625, weight: 3}},
	} {
		got, ok := parseMove(m.String())
		if !ok || got.from != m.from || got.id != m.id || (got.to == nil) != (m.to == nil) || (m.to != nil && *got.to != *m.to) {
			t.Errorf("parseMove(%q) = %+v, %v", m.String(), got, ok)
		}
	}
	for _, m := range []attemptMsg{{from: "p", seq: 7}, {from: "p", seq: 8, n: 3}} {
		if got, ok := parseAttempt(m.String()); !ok || got != m {
			t.Errorf("parseAttempt(%q) = %+v, %v", m.String(), got, ok)
		}
	}
	for _, msg := range []string{"", "3", takenBack, "m p", "w p x 3", "l p 1 2", "m p t x", "m p t y 1", "m p t 1"} {
		if _, ok := parseMove(msg); ok {
			t.Errorf("parseMove(%q) took it", msg)
		}
		if _, ok := parseAttempt(msg); ok {
			t.Errorf("parseAttempt(%q) took it", msg)
		}
	}
}
