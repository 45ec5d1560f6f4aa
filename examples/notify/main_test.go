package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// The burst is larger than both limits: exactly 100 are sent in all, none
// of the types above 10, and every event is accounted for.
func TestRun(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	for round := 1; round <= 2; round++ { // a second run starts from an empty window
		var out bytes.Buffer
		tallies, err := run(context.Background(), rdb, &out)
		if err != nil {
			t.Fatal(err)
		}
		total := tallies[eventTypes]
		if total.events != events || total.sent != allTypes || total.sent+total.droppedByType+total.droppedByTotal != events {
			t.Errorf("round %d: total %+v, want %d events, %d sent, the rest dropped", round, total, events, allTypes)
		}
		sent := 0
		for i, tl := range tallies[:eventTypes] {
			if tl.sent > perType {
				t.Errorf("round %d: %s sent %d, over the cap of %d", round, typeName(i), tl.sent, perType)
			}
			sent += tl.sent
		}
		if sent != total.sent || total.droppedByType == 0 || total.droppedByTotal == 0 {
			t.Errorf("round %d: per-type sent add up to %d of %d; drops %+v: want both caps to bite", round, sent, total.sent, total)
		}
		if !strings.Contains(out.String(), "total") {
			t.Errorf("round %d printed no total:\n%s", round, out.String())
		}
	}
}
