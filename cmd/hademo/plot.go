package main

import (
	"fmt"
	"image/color"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hagroup/hagroup/test/load"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// rateWindow is the averaging window of the plotted rates.
const rateWindow = 500 * time.Millisecond

// memberColors are the lines of the members, in name order.
func memberColors() []color.RGBA {
	return []color.RGBA{
		{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
		{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
		{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
		{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
		{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, // cyan
	}
}

// drawFailover writes the failover picture: operations per second of each
// member over the load (as libhapkcs11.so in the load process counted
// them), the total, the offered rate, the kill, restart and return to
// rotation, and under the axis what sets the rate.
func drawFailover(path string, r *failoverRun, lines []load.StatsLine) error {
	p := plot.New()
	how := "flat out"
	if r.rate > 0 {
		how = fmt.Sprintf("%d/s offered", r.rate)
	}
	p.Title.Text = fmt.Sprintf("Signing through libhapkcs11.so, %s: %s killed, then back", how, r.victim)
	note := loadNote(r.rate)
	if ph := ratesByPhase(r); !ph.keptUp(r.rate) {
		note += fmt.Sprintf("; this run fell short of it where the total dips (%.0f/s before the kill, %.0f/s while %s was out, %.0f/s after)",
			ph.before, ph.out, r.victim, ph.after)
	}
	p.X.Label.Text = "seconds since the load started\n" + wrap(note, 80)
	p.Y.Label.Text = "signatures per second"
	// The legend sits top left, below the title, over headroom that no
	// line reaches (ytop below), left of the marks, whose labels are
	// staggered above the lines too.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(6)
	p.Legend.YOffs = -vg.Points(6)
	p.Add(plotter.NewGrid())

	rates := load.Rates(lines, groupLabel, rateWindow)
	var names []string
	for n := range rates {
		names = append(names, n)
	}
	sort.Strings(names)
	sec := func(t time.Time) float64 { return t.Sub(r.start).Seconds() }
	ymax := 1.0
	totals := map[float64]float64{}
	var xs []float64
	for i, n := range names {
		var pts plotter.XYs
		for _, pt := range rates[n] {
			x := sec(pt.At)
			if x < 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: x, Y: pt.Value})
			if _, seen := totals[x]; !seen {
				xs = append(xs, x)
			}
			totals[x] += pt.Value
			ymax = max(ymax, pt.Value)
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = memberColors()[i%len(memberColors())]
		l.Width = vg.Points(1.5)
		p.Add(l)
		label := n
		if n == r.victim {
			label += " (primary, killed)"
		}
		for _, pl := range plan() {
			if pl.name == n && pl.standby {
				label += " (standby)"
			}
		}
		p.Legend.Add(label, l)
	}
	if len(xs) > 0 {
		sort.Float64s(xs)
		var pts plotter.XYs
		for _, x := range xs {
			pts = append(pts, plotter.XY{X: x, Y: totals[x]})
			ymax = max(ymax, totals[x])
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 0xff}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("total", l)
	}
	if r.rate > 0 {
		ymax = max(ymax, float64(r.rate))
		x1 := 1.0
		if len(xs) > 0 {
			x1 = xs[len(xs)-1]
		}
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(r.rate)}, {X: x1, Y: float64(r.rate)}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{A: 0xff}
		l.Width = vg.Points(0.75)
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("offered %d/s", r.rate), l)
	}
	ytop := ymax * 1.6
	p.Y.Min, p.Y.Max = 0, ytop
	p.Y.Tick.Marker = rateTicks{}
	marks := []struct {
		at    time.Time
		label string
		c     color.RGBA
	}{
		{r.kill, "kill -9 " + r.victim, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}},
		{r.restart, "server restarted", color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}},
		{r.back, "back in rotation", color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}},
	}
	var labels plotter.XYLabels
	for i, m := range marks {
		if m.at.IsZero() {
			continue
		}
		x := sec(m.at)
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: ytop}})
		if err != nil {
			return err
		}
		l.Color = m.c
		l.Width = vg.Points(1)
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
		// Stagger the labels so that close marks stay readable.
		labels.XYs = append(labels.XYs, plotter.XY{X: x, Y: ytop * (0.90 - 0.06*float64(i))})
		labels.Labels = append(labels.Labels, " "+m.label)
	}
	if len(labels.XYs) > 0 {
		lb, err := plotter.NewLabels(labels)
		if err != nil {
			return err
		}
		for i := range lb.TextStyle {
			lb.TextStyle[i].Color = marks[min(i, len(marks)-1)].c
			lb.TextStyle[i].YAlign = draw.YCenter
		}
		p.Add(lb)
	}
	p.X.Min = 0
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}

// wrap breaks text into lines of at most width bytes at spaces.
func wrap(text string, width int) string {
	var out, line string
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			out += line + "\n"
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return out + line
}

// rateTicks labels the rate axis in whole signatures per second at a
// round step (1, 2 or 5 times a power of ten), about five labels high.
type rateTicks struct{}

// Ticks implements plot.Ticker.
func (rateTicks) Ticks(lo, hi float64) []plot.Tick {
	raw := (hi - lo) / 5
	if raw <= 0 {
		return nil
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return ticks
}
