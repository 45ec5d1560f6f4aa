package backoff

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestWaitsDouble(t *testing.T) {
	b := New(2*time.Millisecond, 10*time.Millisecond)
	want := []time.Duration{2, 4, 8, 10, 10}
	for i, w := range want {
		if got := b.NextBackoff(); got != w*time.Millisecond {
			t.Fatalf("wait %d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
}

func TestJitteredWithinAQuarter(t *testing.T) {
	b := Jittered(time.Millisecond, 16*time.Millisecond)
	for i, base := range []time.Duration{1, 2, 4, 8, 16, 16, 16} {
		d, base := b.NextBackoff(), base*time.Millisecond
		if d < base-base/4 || d > base+base/4 {
			t.Fatalf("wait %d = %v, want within 25%% of %v", i, d, base)
		}
	}
}

// Retry stops when an attempt is over, or when ctx ends between attempts.
func TestRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tries := 0
		New(time.Millisecond, 4*time.Millisecond).Retry(context.Background(), func() bool {
			tries++
			return tries == 4
		})
		if tries != 4 || time.Since(start) != 7*time.Millisecond {
			t.Fatalf("%d tries in %v, want 4 in 7ms (1+2+4)", tries, time.Since(start))
		}

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		tries = 0
		New(time.Millisecond, 4*time.Millisecond).Retry(ctx, func() bool { tries++; return false })
		if ctx.Err() == nil || tries != 4 {
			t.Fatalf("%d tries before ctx ended (err %v), want 4: at 0, 1, 3 and 7ms", tries, ctx.Err())
		}
	})
}
