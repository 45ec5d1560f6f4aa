package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as one process of the processes
// table, as the program does.
func TestMain(m *testing.M) {
	if code, ok := childMode(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestQuick runs the whole program in -quick mode, when redis-server is
// installed: every implementation, every table, the checks, the report
// and the chart.
func TestQuick(t *testing.T) {
	if !redisAvailable() {
		t.Skip("redis-server is not installed (the program itself would install it)")
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := benchMain([]string{"-quick", "-out", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	sections := sectionsOf(stdout.String())
	for heading, rows := range quickRows() {
		for _, want := range rows {
			if !strings.Contains(sections[heading], want) {
				t.Errorf("section %q has no %q:\n%s", heading, want, stdout.String())
			}
		}
	}
	if strings.Contains(stdout.String(), "OVER") {
		t.Errorf("a limiter over-admitted:\n%s", stdout.String())
	}
	for _, name := range []string{mdName, pngName} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", name, err)
		}
	}
}

// sectionsOf splits markdown into its "## " sections, by heading.
func sectionsOf(md string) map[string]string {
	sections := map[string]string{}
	for _, sec := range strings.Split(md, "## ")[1:] {
		heading, body, _ := strings.Cut(sec, "\n")
		sections[heading] = body
	}
	return sections
}

// quickRows are the starts of rows each section of the quick run must
// have, by heading.
func quickRows() map[string][]string {
	want := map[string][]string{
		"SortedSet cost": {"| 10/min | 10 |", "| 1 000/min | 1 000 |", "| 10 000/min | 10 000 |"},
		"Targets":        {"targets met."},
	}
	for _, s := range quickSteady {
		for _, name := range []string{sortedSetName, windowsName} {
			want["Steady state"] = append(want["Steady state"], "| "+name+" | "+s.Window.String()+" | "+phaseNames[phaseSteady]+" |")
		}
	}
	for _, a := range abuserImpls() {
		want["Abuser"] = append(want["Abuser"], "| "+a.name+" | "+a.how+" |")
	}
	for _, im := range procsImpls() {
		want["Processes"] = append(want["Processes"], "| "+im.name+" | 4 processes x 16 goroutines, 2s |")
	}
	for _, im := range memoryImpls() {
		want["Memory"] = append(want["Memory"], "| "+im.name+" | ")
	}
	for _, im := range inProcessImpls(quickInProcess) {
		want["In process"] = append(want["In process"], "| "+im.name+" | ")
	}
	for _, im := range inflightImpls() {
		for _, s := range quickInflight {
			want["In flight"] = append(want["In flight"], fmt.Sprintf("| %s | %d | %d | %v | ", im.name, s.Goroutines, s.N, s.Hold))
		}
	}
	for _, im := range implementations() {
		for _, w := range quickWorkloads() {
			for _, limit := range []string{"10", "1 000 000"} {
				want["Throughput"] = append(want["Throughput"], "| "+w.Name+" | "+limit+"/min | "+im.name+" |")
			}
		}
		if im.ours {
			want["Hammer"] = append(want["Hammer"], "| "+im.name+" | 3 Buckets x 8 goroutines, 1.5s | 50/s |")
		}
		if im.bound != nil {
			want["Noisy neighbour"] = append(want["Noisy neighbour"], "| "+im.name+" | ")
		}
	}
	return want
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
	if got := fixedWindowsBound(10, time.Minute, 4*time.Second); got != 20 {
		t.Errorf("fixedWindowsBound within one window = %d, want 20 (a span may straddle two fixed windows)", got)
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
		{1000 * ms, 1004 * ms, 1}, {0, 10 * ms, 1}, {5 * ms, 20 * ms, 1}, {990 * ms, 999 * ms, 1},
		{6 * ms, 1006 * ms, 1}, // sent inside [5ms, 1005ms), answered after it: not counted
		{1001 * ms, 1003 * ms, 3},
	}
	if got := mostWithin(spans, time.Second); got != 6 {
		t.Errorf("mostWithin = %d, want 6 (the weight of the calls within [5ms, 1005ms))", got)
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

// A peer whose design lets it pass its bound is reported, not failed; any
// other limiter that passes its bound fails the run.
func TestOverAdmitted(t *testing.T) {
	for _, im := range implementations() {
		check, violation := im.overAdmitted("3 > 2")
		if violation == (im.overAdmits != "") || !strings.HasSuffix(check, "3 > 2") {
			t.Errorf("%s: overAdmitted = %q, %v", im.name, check, violation)
		}
		if violation != strings.Contains(check, "OVER") {
			t.Errorf("%s: %q: the quick test looks for OVER to find a failure", im.name, check)
		}
		if im.ours && !violation {
			t.Errorf("%s passes its bound without failing the run", im.name)
		}
	}
}
