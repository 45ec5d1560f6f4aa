package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuick runs the whole program in -quick mode, when redis-server is
// installed: every implementation, every workload shape, the checks, the
// report and the chart.
func TestQuick(t *testing.T) {
	if !redisAvailable() {
		t.Skip("redis-server is not installed (the program itself would install it)")
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := benchMain([]string{"-quick", "-out", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, im := range implementations() {
		for _, w := range quickWorkloads() {
			if !strings.Contains(out, "| "+w.Name+" | 10/min | "+im.name+" |") {
				t.Errorf("no row for %s, %s in:\n%s", w.Name, im.name, out)
			}
		}
	}
	for _, im := range implementations() {
		if im.ours && !strings.Contains(out, "| "+im.name+" | 3 Buckets x 8 goroutines, 1.5s | 50/s |") {
			t.Errorf("no hammer row for %s in:\n%s", im.name, out)
		}
	}
	for _, im := range implementations() {
		if im.bound != nil && !strings.Contains(out, "| "+im.name+" | ") {
			t.Errorf("no noisy-neighbour row for %s in:\n%s", im.name, out)
		}
	}
	for _, limit := range []string{"| 10/min | 10 |", "| 1 000/min | 1 000 |", "| 10 000/min | 10 000 |"} {
		if !strings.Contains(out, limit) {
			t.Errorf("no SortedSet cost row %q in:\n%s", limit, out)
		}
	}
	if !strings.Contains(out, "## Issue 11's targets") || !strings.Contains(out, "targets met.") {
		t.Errorf("no target table in:\n%s", out)
	}
	if strings.Contains(out, "OVER") {
		t.Errorf("a limiter over-admitted:\n%s", out)
	}
	for _, name := range []string{mdName, pngName} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", name, err)
		}
	}
}

func TestBounds(t *testing.T) {
	if got := windowBound(10, time.Minute, 4*time.Second); got != 10 {
		t.Errorf("windowBound within one window = %d, want 10", got)
	}
	if got := windowBound(10, time.Minute, 61*time.Second); got != 20 {
		t.Errorf("windowBound over two windows = %d, want 20", got)
	}
	if got := gcraBound(1000, time.Minute, 6*time.Second); got != 1101 {
		t.Errorf("gcraBound = %d, want 1000 + 100 + 1", got)
	}
}

func TestPercentile(t *testing.T) {
	d := sortedDurations([]int64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if p := percentile(d, 50); p != 5 {
		t.Errorf("p50 = %v, want 5", p)
	}
	if p := percentile(d, 99); p != 10 {
		t.Errorf("p99 = %v, want 10", p)
	}
}

func TestWorkloadsDistinct(t *testing.T) {
	for _, w := range append(fullWorkloads(), quickWorkloads()...) {
		if err := w.checkDistinct(); err != nil {
			t.Error(err)
		}
	}
}

func TestMostWithin(t *testing.T) {
	ms := time.Millisecond
	spans := []interval{
		{1000 * ms, 1004 * ms}, {0, 10 * ms}, {5 * ms, 20 * ms}, {990 * ms, 999 * ms},
		{6 * ms, 1006 * ms}, // sent inside [5ms, 1005ms), answered after it: not counted
		{1001 * ms, 1003 * ms},
	}
	if got := mostWithin(spans, time.Second); got != 4 {
		t.Errorf("mostWithin = %d, want 4 (the calls within [5ms, 1005ms))", got)
	}
	if got := mostWithin(nil, time.Second); got != 0 {
		t.Errorf("mostWithin(nil) = %d, want 0", got)
	}
}

func TestHammerIdeal(t *testing.T) {
	if got := fullHammer.ideal(); got != 250 {
		t.Errorf("ideal of 50/s over 4.5s = %d, want 250 (50 in each of 5 started seconds)", got)
	}
}
