package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// palette gives each implementation, in table order, a colour.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x9e, 0xda, 0xe5, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
}

// chart draws decisions/s as horizontal bars, one group per workload and
// limit, one bar per implementation, on a log scale when the values span
// more than two decades.
func chart(w io.Writer, rows []row, window time.Duration, title string) error {
	face := basicfont.Face7x13
	const (
		width   = 1100
		left    = 190 // implementation names
		right   = 90  // value labels
		barH    = 13
		barGap  = 3
		groupGp = 10
		headH   = 18
		top     = 72
		bottom  = 40
	)
	type group struct {
		name string
		rows []row
	}
	var groups []group
	var impls []string
	implIndex := map[string]int{}
	lo, hi := math.Inf(1), 0.0
	for _, r := range rows {
		name := fmt.Sprintf("%s; limit %d/%s", r.Workload.Name, r.Limit, shortDur(window))
		if len(groups) == 0 || groups[len(groups)-1].name != name {
			groups = append(groups, group{name: name})
		}
		g := &groups[len(groups)-1]
		g.rows = append(g.rows, r)
		if _, ok := implIndex[r.Impl]; !ok {
			implIndex[r.Impl] = len(impls)
			impls = append(impls, r.Impl)
		}
		if r.Rate > 0 {
			lo, hi = min(lo, r.Rate), max(hi, r.Rate)
		}
	}
	if hi == 0 {
		return fmt.Errorf("nothing to draw")
	}
	logScale := hi/lo > 100
	var x0, x1 float64 // the axis range: values or log10 of values
	if logScale {
		x0, x1 = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	} else {
		x0, x1 = 0, hi*1.05
	}
	plotW := float64(width - left - right)
	xOf := func(v float64) int {
		if logScale {
			v = math.Log10(max(v, math.Pow(10, x0)))
		}
		return left + int((v-x0)/(x1-x0)*plotW)
	}

	height := top + bottom
	for _, g := range groups {
		height += headH + len(g.rows)*(barH+barGap) + groupGp
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	fill := func(x0, y0, x1, y1 int, c color.Color) {
		draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(c), image.Point{}, draw.Src)
	}
	text := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	textW := func(s string) int { return font.MeasureString(face, s).Ceil() }
	black := color.Black
	grey := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	dark := color.RGBA{0x55, 0x55, 0x55, 0xff}

	text(10, 20, title, black)
	scale := "linear scale"
	if logScale {
		scale = "log scale"
	}
	text(10, 38, "decisions per second, higher is better ("+scale+")", dark)

	// Grid and axis labels.
	ticks := []float64{}
	if logScale {
		for e := x0; e <= x1; e++ {
			ticks = append(ticks, math.Pow(10, e))
		}
	} else {
		step := math.Pow(10, math.Floor(math.Log10(x1/2)))
		for v := 0.0; v <= x1; v += step {
			ticks = append(ticks, v)
		}
	}
	for _, v := range ticks {
		x := xOf(v)
		fill(x, top-4, x+1, height-bottom+4, grey)
		label := strconv.FormatFloat(v, 'g', -1, 64)
		if v >= 1000 {
			label = thousands(int64(v))
		}
		text(x-textW(label)/2, height-bottom+20, label, dark)
		text(x-textW(label)/2, top-10, label, dark)
	}

	y := top
	for _, g := range groups {
		text(10, y+13, g.name, black)
		y += headH
		for _, r := range g.rows {
			c := palette[implIndex[r.Impl]%len(palette)]
			name := r.Impl
			for textW(name) > left-16 && len(name) > 1 {
				name = name[:len(name)-1]
			}
			text(left-8-textW(name), y+barH-2, name, black)
			x := xOf(r.Rate)
			fill(left, y, max(x, left+1), y+barH, c)
			text(x+4, y+barH-2, rate(r.Rate), black)
			y += barH + barGap
		}
		y += groupGp
	}
	fill(left, top-4, left+1, height-bottom+4, dark)
	return png.Encode(w, img)
}
