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
