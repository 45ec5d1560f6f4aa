package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want leakybucket.Limit // zero: an error
	}{
		{"100/30m", leakybucket.Per(100, 30*time.Minute)},
		{"10/1m30s", leakybucket.Per(10, 90*time.Second)},
		{"5/s", leakybucket.Per(5, time.Second)},
		{"5/h", leakybucket.Per(5, time.Hour)},
		{"1/1ms", leakybucket.Per(1, time.Millisecond)},
		{"+7/2s", leakybucket.Per(7, 2*time.Second)},
		{"", leakybucket.Limit{}},
		{"100", leakybucket.Limit{}},
		{"100:30m", leakybucket.Limit{}},
		{"/1m", leakybucket.Limit{}},
		{"0/1m", leakybucket.Limit{}},
		{"-1/1m", leakybucket.Limit{}},
		{"ten/1m", leakybucket.Limit{}},
		{"1.5/1m", leakybucket.Limit{}},
		{"10/", leakybucket.Limit{}},
		{"10/0s", leakybucket.Limit{}},
		{"10/-1m", leakybucket.Limit{}},
		{"10/999us", leakybucket.Limit{}},
		{"10/30", leakybucket.Limit{}},
		{"10/minute", leakybucket.Limit{}},
		{"10/1m/2", leakybucket.Limit{}},
		{"99999999999999999999/1m", leakybucket.Limit{}},
		{"100/1h@1m", leakybucket.Per(100, time.Hour).WithPrecision(time.Minute)},
		{"10/s@100ms", leakybucket.Per(10, time.Second).WithPrecision(100 * time.Millisecond)},
		{"10/1m@1m", leakybucket.Per(10, time.Minute).WithPrecision(time.Minute)},
		{"10/1m@2m", leakybucket.Limit{}},
		{"10/1m@0s", leakybucket.Limit{}},
		{"10/1m@999us", leakybucket.Limit{}},
		{"10/1m@", leakybucket.Limit{}},
		{"10/1m@m", leakybucket.Limit{}},
		{"10/1m@1s@1s", leakybucket.Limit{}},
		{"10@1s/1m", leakybucket.Limit{}},
	} {
		got, err := parseLimit(tc.in)
		if (err != nil) != (tc.want == leakybucket.Limit{}) || got != tc.want {
			t.Errorf("parseLimit(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseLimit checks that parseLimit never panics, and that whatever it
// accepts is a Limit New accepts, which it parses again from its own
// spelling.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/30m", "10/s", "1/1ms", "0/1m", "10/1m/2", "5/µs", "/", "9223372036854775807/2562047h47m16.854775807s", "100/1h@1m", "1/1ms@1ms", "1/1m@1h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLimit(s)
		if err != nil {
			return
		}
		if l.Requests < 1 || l.Window < time.Millisecond || l.Precision != 0 && (l.Precision < time.Millisecond || l.Precision > l.Window) {
			t.Fatalf("parseLimit(%q) = %v, out of range", s, l)
		}
		again, err := parseLimit(formatLimit(l))
		if err != nil || again != l {
			t.Fatalf("parseLimit(%q) = %v, but its spelling parses as %v, %v", s, l, again, err)
		}
	})
}

func TestParseStrategy(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: the strategy's String; "" for an error
	}{
		{"logs", leakybucket.Logs.String()},
		{"sortedset", leakybucket.SortedSet.String()},
		{"windows:1s", leakybucket.Windows(time.Second).String()},
		{"windows:250ms", leakybucket.Windows(250 * time.Millisecond).String()},
		{"", ""},
		{"Logs", ""},
		{"sorted set", ""},
		{"windows", ""},
		{"windows:fixed", leakybucket.FixedWindows.String()},
		{"windows:0s", ""},
		{"windows:", ""},
		{"windows:0s", ""},
		{"windows:10us", ""},
		{"windows:1", ""},
		{"windows(1s)", ""},
	} {
		s, err := parseStrategy(tc.in)
		got := ""
		if err == nil {
			got = s.String()
		}
		if got != tc.want || (err == nil) == (tc.want == "") {
			t.Errorf("parseStrategy(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Minute:                   "30m",
		time.Hour:                          "1h",
		90 * time.Minute:                   "1h30m",
		90 * time.Second:                   "1m30s",
		time.Hour + time.Second:            "1h0m1s",
		1500 * time.Millisecond:            "1.5s",
		time.Minute:                        "1m",
		10 * time.Second:                   "10s",
		time.Millisecond:                   "1ms",
		24*time.Hour + time.Minute:         "24h1m",
		time.Minute + 100*time.Millisecond: "1m0.1s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestRuleFlagsKeepOrder checks that -resource-limit and -client-limit add
// their rules in the order given, before or after the subcommand's name,
// as New takes them.
func TestRuleFlagsKeepOrder(t *testing.T) {
	g := newGlobals()
	top := newFlagSet("leakybucket", nil)
	g.register(top)
	if err := top.Parse([]string{"-client-limit", "10/1m", "-resource-limit", "100/30m", "-prefix", "p", "peek"}); err != nil {
		t.Fatal(err)
	}
	sub, _ := peekCommand.flagSet(g, nil)
	if err := sub.Parse([]string{"-client-limit", "1/s", "-resource", "r"}); err != nil {
		t.Fatal(err)
	}
	want := []leakybucket.Rule{
		{PerClient: true, Limit: leakybucket.Per(10, time.Minute)},
		{Limit: leakybucket.Per(100, 30*time.Minute)},
		{PerClient: true, Limit: leakybucket.Per(1, time.Second)},
	}
	if fmt.Sprint(g.rules) != fmt.Sprint(want) {
		t.Errorf("rules = %v, want %v", g.rules, want)
	}
	if g.prefix != "p" {
		t.Errorf("prefix = %q after the subcommand's flags, want the one given before: p", g.prefix)
	}
}

// A limit may end in a burst, which New takes under gcra only.
func TestParseLimitBurst(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want leakybucket.Limit // zero: an error
	}{
		{"10/1s,burst=50", leakybucket.Per(10, time.Second).WithBurst(50)},
		{"100/2s,burst=20", leakybucket.Per(100, 2*time.Second).WithBurst(20)},
		{"1/1m,burst=1", leakybucket.Per(1, time.Minute).WithBurst(1)},
		{"10/1h@1m,burst=5", leakybucket.Per(10, time.Hour).WithPrecision(time.Minute).WithBurst(5)}, // New refuses it
		{"10/s,burst=0", leakybucket.Limit{}},
		{"10/s,burst=-5", leakybucket.Limit{}},
		{"10/s,burst=", leakybucket.Limit{}},
		{"10/s,burst=five", leakybucket.Limit{}},
		{"10/s,burst=5,burst=6", leakybucket.Limit{}},
		{"10/s,burst=5@1s", leakybucket.Limit{}},
		{"10/s,burst=99999999999999999999", leakybucket.Limit{}},
		{"10/s,50", leakybucket.Limit{}},
		{",burst=5", leakybucket.Limit{}},
	} {
		got, err := parseLimit(tc.in)
		if (err != nil) != (tc.want == leakybucket.Limit{}) || got != tc.want {
			t.Errorf("parseLimit(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if err == nil && formatLimit(got) != tc.in {
			t.Errorf("formatLimit(%v) = %q, want %q", got, formatLimit(got), tc.in)
		}
	}
}
