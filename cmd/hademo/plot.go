package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hagroup/hagroup/internal/svgplot"
	"github.com/hagroup/hagroup/test/load"
)

// rateWindow is the averaging window of the plotted rates.
const rateWindow = 500 * time.Millisecond

// memberColors are the lines of the members, in name order.
func memberColors() []svgplot.Color {
	return []svgplot.Color{
		{R: 0x1f, G: 0x77, B: 0xb4}, // blue
		{R: 0x2c, G: 0xa0, B: 0x2c}, // green
		{R: 0x94, G: 0x67, B: 0xbd}, // purple
		{R: 0x8c, G: 0x56, B: 0x4b}, // brown
		{R: 0x17, G: 0xbe, B: 0xcf}, // cyan
	}
}

// drawFailover writes the failover picture: operations per second of each
// member over the load (as libhapkcs11.so in the load process counted
// them), the total, the offered rate, the kill, restart and return to
// rotation, and under the axis what sets the rate.
func drawFailover(path string, r *failoverRun, lines []load.StatsLine) error {
	how := "flat out"
	if r.rate > 0 {
		how = fmt.Sprintf("%d/s offered", r.rate)
	}
	note := loadNote(r.rate)
	if ph := ratesByPhase(r); !ph.keptUp(r.rate) {
		note += fmt.Sprintf("; this run fell short of it where the total dips (%.0f/s before the kill, %.0f/s while %s was out, %.0f/s after)",
			ph.before, ph.out, r.victim, ph.after)
	}
	c := &svgplot.Chart{
		Title:  fmt.Sprintf("Signing through libhapkcs11.so, %s: %s killed, then back", how, r.victim),
		XLabel: "seconds since the load started\n" + wrap(note, 100),
		YLabel: "signatures per second",
		Width:  960, Height: 480,
	}

	rates := load.Rates(lines, groupLabel, rateWindow)
	names := slices.Sorted(maps.Keys(rates))
	sec := func(t time.Time) float64 { return t.Sub(r.start).Seconds() }
	ymax := 1.0
	totals := map[float64]float64{}
	var xs []float64
	for i, n := range names {
		l := svgplot.Line{Color: memberColors()[i%len(memberColors())], Width: 1.5}
		for _, pt := range rates[n] {
			x := sec(pt.At)
			if x < 0 {
				continue
			}
			l.X, l.Y = append(l.X, x), append(l.Y, pt.Value)
			if _, seen := totals[x]; !seen {
				xs = append(xs, x)
			}
			totals[x] += pt.Value
			ymax = max(ymax, pt.Value)
		}
		if len(l.X) == 0 {
			continue
		}
		l.Label = n
		if n == r.victim {
			l.Label += " (primary, killed)"
		}
		for _, pl := range plan() {
			if pl.name == n && pl.standby {
				l.Label += " (standby)"
			}
		}
		c.Lines = append(c.Lines, l)
	}
	if len(xs) > 0 {
		sort.Float64s(xs)
		total := svgplot.Line{Label: "total", Color: svgplot.Color{R: 0x70, G: 0x70, B: 0x70}, Dashes: []float64{4, 3}}
		for _, x := range xs {
			total.X, total.Y = append(total.X, x), append(total.Y, totals[x])
			ymax = max(ymax, totals[x])
		}
		c.Lines = append(c.Lines, total)
	}
	if r.rate > 0 {
		ymax = max(ymax, float64(r.rate))
		x1 := 1.0
		if len(xs) > 0 {
			x1 = xs[len(xs)-1]
		}
		c.Lines = append(c.Lines, svgplot.Line{Label: fmt.Sprintf("offered %d/s", r.rate),
			X: []float64{0, x1}, Y: []float64{float64(r.rate), float64(r.rate)}, Width: 0.75, Dashes: []float64{1, 2}})
	}
	// Headroom above every line for the legend (top left) and the marks'
	// labels, staggered so that close marks stay readable.
	c.YMin, c.YMax = 0, ymax*1.6
	marks := []struct {
		at    time.Time
		label string
		c     svgplot.Color
	}{
		{r.kill, "kill -9 " + r.victim, svgplot.Color{R: 0xd6, G: 0x27, B: 0x28}},
		{r.restart, "server restarted", svgplot.Color{R: 0xff, G: 0x7f, B: 0x0e}},
		{r.back, "back in rotation", svgplot.Color{R: 0x2c, G: 0xa0, B: 0x2c}},
	}
	for i, m := range marks {
		if !m.at.IsZero() {
			c.Marks = append(c.Marks, svgplot.Mark{X: sec(m.at), Label: m.label, Color: m.c, LabelY: 0.90 - 0.06*float64(i)})
		}
	}
	if len(xs) > 0 {
		c.XMax = max(xs[len(xs)-1], 1)
	}
	return c.Save(path)
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
