package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot bounds.
const (
	plotPoints = 400  // points per curve
	plotMinMs  = 0.01 // lateness below this (or negative: early) is drawn at it
)

type series struct {
	name    string
	samples []int64 // ns
	missing int     // never ran: the curve stops short of 100 %
	color   color.Color
	dashes  []vg.Length
}

// plotLateness draws the empirical CDFs of lateness (ms, log scale) as an SVG.
func plotLateness(path, title string, ss []series) error {
	p := plot.New()
	p.Title.Text = title
	// A long axis label makes gonum/plot shrink the data area: the definition is in
	// the title, and what is drawn at 0.01 ms is said in BENCHMARKS.md.
	p.X.Label.Text = "lateness (ms, log scale)"
	p.Y.Label.Text = "fraction of jobs started"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	// Top left is empty: every curve is still near 0 % below 0.1 ms, except early
	// starts, which are drawn at the bottom of the 0.01 ms line.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(10)
	p.Legend.YOffs = -vg.Points(6)
	p.Add(plotter.NewGrid())
	xmax := plotMinMs * 10
	for _, s := range ss {
		if len(s.samples) == 0 {
			continue
		}
		v := slices.Clone(s.samples)
		slices.Sort(v)
		total := float64(len(v) + s.missing)
		pts := make(plotter.XYs, 0, plotPoints+1)
		for k := 0; k <= plotPoints; k++ {
			i := min(len(v)-1, k*(len(v)-1)/plotPoints)
			x := max(float64(v[i])/1e6, plotMinMs)
			pts = append(pts, plotter.XY{X: x, Y: float64(i+1) / total})
			xmax = max(xmax, x)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = s.color
		l.Width = vg.Points(1.6)
		l.Dashes = s.dashes
		p.Add(l)
		name := s.name
		if s.missing > 0 {
			name += fmt.Sprintf(" (%d not run)", s.missing)
		}
		p.Legend.Add(name, l)
	}
	p.X.Min = plotMinMs
	p.X.Max = math.Pow(10, math.Ceil(math.Log10(xmax)))
	p.Legend.ThumbnailWidth = vg.Points(24)
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}
