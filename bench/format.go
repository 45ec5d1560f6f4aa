package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Formatting of figures, shared by the tables.

// round rounds a latency to three figures or so.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// thousands writes n with a space between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ' ')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// rate is decisions/s: whole above 100, else with one or two decimals.
func rate(x float64) string {
	switch {
	case x >= 100:
		return thousands(int64(x + 0.5))
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// errorsCell is the count of errors and the first one's message, cut short.
func errorsCell(n int64, first string) string {
	if n == 0 {
		return "0"
	}
	msg := first
	if len(msg) > 80 {
		msg = msg[:80] + "…"
	}
	return fmt.Sprintf("%s (%s)", thousands(n), strings.ReplaceAll(msg, "|", "\\|"))
}

// spanOf formats the smallest and the largest of vals: "a–b", or one
// figure when they agree.
func spanOf(vals []float64, format func(float64) string) string {
	if len(vals) == 0 {
		return "–"
	}
	a, b := format(slices.Min(vals)), format(slices.Max(vals))
	if a == b {
		return a
	}
	return a + "–" + b
}

func latency(x float64) string { return round(time.Duration(x)).String() }

// markdownTable is head (the header and separator lines) and one line of
// each row.
func markdownTable[T any](head string, rows []T, line func(T) string) string {
	var b strings.Builder
	b.WriteString(head)
	for _, r := range rows {
		b.WriteString(line(r))
	}
	return b.String()
}

// unitNames are the short and long names of the windows' units.
var unitNames = map[time.Duration][2]string{time.Second: {"s", "second"}, time.Minute: {"min", "minute"}, time.Hour: {"h", "hour"}}

// shortDur is a window's short unit, "min", or its duration.
func shortDur(d time.Duration) string {
	if n, ok := unitNames[d]; ok {
		return n[0]
	}
	return d.String()
}

// windowName is a window's unit, "minute", or its duration.
func windowName(d time.Duration) string {
	if n, ok := unitNames[d]; ok {
		return n[1]
	}
	return d.String()
}
