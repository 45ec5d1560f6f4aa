package httplimit

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

// failing answers 500 to /fail and 200 to anything else.
var failing = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/fail" {
		http.Error(w, "down", http.StatusInternalServerError)
		return
	}
	_, _ = w.Write([]byte("ok"))
})

// WithRefund(ServerErrors): a request the handler answers 500 gets its
// weight back, so that any number of them leave the client's 3 intact;
// one answered 200 keeps it.
func TestRefundServerErrors(t *testing.T) {
	rules := []leakybucket.Option{leakybucket.WithStrategy(leakybucket.GCRA), leakybucket.PerClient(leakybucket.Per(3, time.Hour))}
	local, err := leakybucket.NewLocal(rules...)
	if err != nil {
		t.Fatal(err)
	}
	rdb, _ := miniClient(t)
	for name, b := range map[string]*leakybucket.Bucket{"local": local, "miniredis": bucket(t, rdb, rules...)} {
		t.Run(name, func(t *testing.T) {
			mw, err := New(b, "api", WithRefund(ServerErrors))
			if err != nil {
				t.Fatal(err)
			}
			h := mw(failing)
			for i, c := range []struct {
				path string
				want int
			}{
				{"/fail", 500}, {"/fail", 500}, {"/fail", 500}, {"/fail", 500}, // each given back
				{"/", 200}, {"/", 200}, {"/fail", 500}, {"/", 200}, // 2 kept, then the third
				{"/", 429}, {"/fail", 429}, // the 200s kept theirs
			} {
				if got := get2(h, c.path).Code; got != c.want {
					t.Fatalf("request %d, %s: %d, want %d", i, c.path, got, c.want)
				}
			}
		})
	}
}

// A Bucket that cannot give weight back fails every request by the
// failure policy, with an error matching errors.ErrUnsupported.
func TestRefundNeedsGCRA(t *testing.T) {
	b, err := leakybucket.NewLocal(leakybucket.PerClient(leakybucket.Per(3, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	var got error
	mw, err := New(b, "api", WithRefund(ServerErrors), WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		got = err
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if code := get2(mw(failing), "/").Code; code != 503 || !errors.Is(got, errors.ErrUnsupported) {
		t.Fatalf("under Logs: %d, %v; want 503, ErrUnsupported", code, got)
	}
}
