package denials

import (
	"strconv"
	"testing"
	"testing/synctest"
	"time"
)

// An answer is given until it is no longer valid, never beyond MaxLife,
// with the time that passed since it was decided.
func TestAnswerExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Cache[string]
		if !c.Empty() {
			t.Fatal("a zero Cache is not empty")
		}
		c.Keep("r", "a", "denied a", 300*time.Millisecond, time.Now())
		c.Keep("r", "b", "denied b", time.Hour, time.Now())
		time.Sleep(299 * time.Millisecond)
		if res, elapsed, ok := c.Answer("r", "a"); !ok || res != "denied a" || elapsed != 299*time.Millisecond {
			t.Errorf("Answer before it expires = %q, %v, %v", res, elapsed, ok)
		}
		time.Sleep(time.Millisecond)
		if _, _, ok := c.Answer("r", "a"); ok {
			t.Error("answered once its validity passed")
		}
		if _, _, ok := c.Answer("r", "b"); !ok {
			t.Error("b's entry, valid for an hour, gave no answer within MaxLife")
		}
		time.Sleep(MaxLife - 300*time.Millisecond)
		if _, _, ok := c.Answer("r", "b"); ok {
			t.Error("answered past MaxLife: another process's flush would go unseen")
		}
		if !c.Empty() {
			t.Error("not empty once every entry expired and was asked for")
		}
	})
}

// Forget drops one client's entry, or a whole resource's, and nothing
// of another resource.
func TestForget(t *testing.T) {
	var c Cache[int]
	now := time.Now()
	for _, k := range []struct{ resource, client string }{{"r", "a"}, {"r", "b"}, {"s", "a"}} {
		c.Keep(k.resource, k.client, 1, time.Minute, now)
	}
	a := "a"
	c.Forget("r", &a)
	if _, _, ok := c.Answer("r", "a"); ok {
		t.Error("r/a answered after Forget(r, a)")
	}
	if _, _, ok := c.Answer("r", "b"); !ok {
		t.Error("r/b forgotten by Forget(r, a)")
	}
	c.Forget("r", nil)
	if _, _, ok := c.Answer("r", "b"); ok {
		t.Error("r/b answered after Forget(r, nil)")
	}
	if _, _, ok := c.Answer("s", "a"); !ok {
		t.Error("s/a forgotten by a flush of r")
	}
}

// The cache never holds more than maxEntries: a full one first drops what
// expired, then caches nothing more.
func TestBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Cache[int]
		for i := range maxEntries {
			c.Keep("r", strconv.Itoa(i), i, 100*time.Millisecond, time.Now())
		}
		c.Keep("r", "late", 0, time.Minute, time.Now())
		if _, _, ok := c.Answer("r", "late"); ok {
			t.Error("a full cache took one more entry")
		}
		time.Sleep(100 * time.Millisecond)
		c.Keep("r", "later", 0, time.Minute, time.Now())
		if _, _, ok := c.Answer("r", "later"); !ok || c.size.Load() != 1 {
			t.Errorf("once the others expired: answered %v, %d entries; want the new one alone", ok, c.size.Load())
		}
	})
}
