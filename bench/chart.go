package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chart draws, with gonum/plot, the throughput table's decisions/s as
// grouped bars on a log scale, and the SortedSet cost table's decisions/s
// by limit on log-log axes, one above the other, as a PNG.
func chart(w io.Writer, res results, window time.Duration, title string) error {
	var plots []*plot.Plot
	if len(res.rows) > 0 {
		plots = append(plots, throughputPlot(res.rows, window, title))
	}
	if p := costPlot(res.cost, window); p != nil {
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return errors.New("nothing to draw")
	}
	const width, panel = 30 * vg.Centimeter, 13 * vg.Centimeter
	img := vgimg.NewWith(vgimg.UseWH(width, panel*vg.Length(len(plots))), vgimg.UseDPI(100))
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Centimeter / 2, PadBottom: vg.Centimeter / 2, PadLeft: vg.Centimeter / 2, PadRight: vg.Centimeter / 2}
	canvases := plot.Align(grid, tiles, draw.New(img))
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// throughputPlot has one group of bars per workload and limit, one bar per
// implementation, in the table's order.
func throughputPlot(rows []row, window time.Duration, title string) *plot.Plot {
	var groups, impls []string
	rates := map[[2]string]float64{} // by group and implementation
	top := 1.0
	for _, r := range rows {
		g := fmt.Sprintf("%s\n%s/%s", r.Workload.Name, thousands(int64(r.Limit)), shortDur(window))
		groups = appendNew(groups, g)
		impls = appendNew(impls, r.Impl)
		rates[[2]string{g, r.Impl}] = r.Rate
		top = max(top, r.Rate)
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "decisions per second, higher is better (log scale)"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 1, top*50 // room above the bars for the legend
	p.NominalX(groups...)
	p.X.Min, p.X.Max = -0.6, float64(len(groups))-0.4 // room for the outer bars
	p.Add(horizontalGrid())
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.Padding = vg.Millimeter

	// Bars rise from 1, the bottom of the log axis, not from 0, which it
	// cannot show: each stands on an invisible bar of height 1.
	base := &plotter.BarChart{Values: make(plotter.Values, len(groups))}
	for i := range base.Values {
		base.Values[i] = 1
	}
	const barW = 11 * vg.Millimeter / 2
	for i, im := range impls {
		vals := make(plotter.Values, len(groups))
		for j, g := range groups {
			vals[j] = rates[[2]string{g, im}]
		}
		bars, err := plotter.NewBarChart(vals, barW)
		if err != nil { // only for negative or NaN values, which rates are not
			panic(err)
		}
		bars.StackOn(base)
		bars.Offset = barW * vg.Length(2*i-len(impls)+1) / 2
		bars.Color, bars.LineStyle.Width = plotutil.Color(i), 0
		p.Add(bars)
		p.Legend.Add(im, bars)
	}
	return p
}

// costPlot is SortedSet's decisions/s by limit; nil if nothing was
// decided.
func costPlot(rows []costRow, window time.Duration) *plot.Plot {
	var pts plotter.XYs
	for _, c := range rows {
		if c.Rate > 0 {
			pts = append(pts, plotter.XY{X: float64(c.Limit), Y: c.Rate})
		}
	}
	if len(pts) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "leakybucket SortedSet, one key whose window holds the limit: decisions per second by limit, one goroutine"
	p.X.Label.Text = fmt.Sprintf("limit, calls per %s (log scale)", windowName(window))
	p.Y.Label.Text = "decisions per second (log scale)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		panic(err) // only for NaN or infinite points, which these are not
	}
	line.Color, points.Color = plotutil.Color(1), plotutil.Color(1)
	p.Add(plotter.NewGrid(), line, points)
	return p
}

func horizontalGrid() *plotter.Grid {
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	return g
}

// appendNew appends s to xs unless it is there already.
func appendNew(xs []string, s string) []string {
	for _, x := range xs {
		if x == s {
			return xs
		}
	}
	return append(xs, s)
}
