package leakybucket

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// A call made with ContextWithShadow is decided and counted as any other,
// and its Decision says Shadow; a call without it does not.
func TestObserverShadow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, SortedSet)
		var heard decisions
		b := e.bucket(t, PerClient(Per(1, time.Minute)), WithObserver(heard.observe))
		res, err := b.Allow(ContextWithShadow(context.Background()), "r", "c")
		if err != nil || !res.Allowed {
			t.Fatalf("shadow Allow = %+v, %v; want allowed", res, err)
		}
		if d := heard.last(t); !d.Shadow || !d.Allowed {
			t.Errorf("shadow Allow observed as %+v, want Shadow and Allowed", d)
		}
		res, err = b.Allow(context.Background(), "r", "c")
		if err != nil || res.Allowed {
			t.Fatalf("Allow after a shadow Allow = %+v, %v; want denied: the shadow call counts", res, err)
		}
		if d := heard.last(t); d.Shadow || d.Allowed {
			t.Errorf("Allow observed as %+v, want neither Shadow nor Allowed", d)
		}
	})
}
