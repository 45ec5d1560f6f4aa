package leakybucket

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Rules lists the rules in the order given to New, and a caller cannot
// change the Bucket's through it.
func TestRules(t *testing.T) {
	b, err := New(redis.NewClient(&redis.Options{}), PerResource(PerMinute(100)), PerClient(Per(3, 10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{{Limit: PerMinute(100)}, {PerClient: true, Limit: Per(3, 10*time.Second)}}
	got := b.Rules()
	if !slices.Equal(got, want) {
		t.Fatalf("Rules() = %v, want %v", got, want)
	}
	got[0].Limit.Requests = 1
	if again := b.Rules(); !slices.Equal(again, want) {
		t.Errorf("changing the returned slice changed the Bucket's rules: %v", again)
	}
}
