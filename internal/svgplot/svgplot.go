// Package svgplot draws a line chart as an SVG file: lines, points,
// vertical marks with labels, a grid, round ticks and a legend. It is what
// the demo's failover picture and the benchmark's scaling picture need,
// written here so that the module carries no plotting library (and its
// fonts, PDF and LaTeX dependencies) for what are two pictures.
package svgplot

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Color is an RGB colour.
type Color struct{ R, G, B uint8 }

func (c Color) String() string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// Line is one series, drawn in order of X.
type Line struct {
	Label  string // in the legend; "" leaves it out
	X, Y   []float64
	Color  Color
	Width  float64   // stroke width in px; 0: 1.5
	Dashes []float64 // SVG stroke-dasharray; nil: solid
	Points bool      // a dot at every point
}

// Mark is a vertical line at X with a label near the top.
type Mark struct {
	X     float64
	Label string
	Color Color
	// LabelY is where the label sits, as a fraction of the plot's height
	// from the bottom (0.9: near the top).
	LabelY float64
}

// Chart is a picture; the zero axes ranges are fitted to the data.
type Chart struct {
	Title          string
	XLabel, YLabel string // XLabel may hold several lines
	Width, Height  float64
	XMin, XMax     float64 // XMax <= XMin: from the data
	YMin, YMax     float64 // YMax <= YMin: from the data
	Lines          []Line
	Marks          []Mark
}

const (
	font    = `font-family="DejaVu Sans, Arial, sans-serif"`
	left    = 70.0
	right   = 20.0
	top     = 40.0
	bottom  = 45.0 // plus the X label's lines
	lineGap = 15.0
)

// Save writes the chart to path.
func (c *Chart) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.Write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// Write writes the chart as an SVG document.
func (c *Chart) Write(w io.Writer) error {
	xmin, xmax, ymin, ymax := c.ranges()
	xl := strings.Split(c.XLabel, "\n")
	pw := c.Width - left - right
	ph := c.Height - top - bottom - lineGap*float64(len(xl))
	if pw <= 0 || ph <= 0 {
		return fmt.Errorf("svgplot: %gx%g is too small", c.Width, c.Height)
	}
	px := func(x float64) float64 { return left + (x-xmin)/(xmax-xmin)*pw }
	py := func(y float64) float64 { return top + ph - (y-ymin)/(ymax-ymin)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g">`+"\n", c.Width, c.Height, c.Width, c.Height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" text-anchor="middle" font-size="14" %s>%s</text>`+"\n", c.Width/2, font, esc(c.Title))
	for _, t := range Ticks(xmin, xmax) {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", x, top, x, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" %s>%s</text>`+"\n", x, top+ph+16, font, label(t))
	}
	for _, t := range Ticks(ymin, ymax) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="11" %s>%s</text>`+"\n", left-6, y+4, font, label(t))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	for i, l := range xl {
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="middle" font-size="12" %s>%s</text>`+"\n", left+pw/2, top+ph+34+lineGap*float64(i), font, esc(l))
	}
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle" font-size="12" %s>%s</text>`+"\n", top+ph/2, font, esc(c.YLabel))

	for _, m := range c.Marks {
		x := px(m.X)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="4 4"/>`+"\n", x, top, x, top+ph, m.Color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" fill="%s" %s> %s</text>`+"\n", x+2, top+ph*(1-m.LabelY), m.Color, font, esc(m.Label))
	}
	for _, l := range c.Lines {
		if len(l.X) == 0 {
			continue
		}
		width := l.Width
		if width == 0 {
			width = 1.5
		}
		var pts []string
		for i := range l.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(l.X[i]), py(l.Y[i])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%g"%s points="%s"/>`+"\n", l.Color, width, dash(l.Dashes), strings.Join(pts, " "))
		if l.Points {
			for i := range l.X {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(l.X[i]), py(l.Y[i]), l.Color)
			}
		}
	}
	y := top + 16
	for _, l := range c.Lines {
		if l.Label == "" {
			continue
		}
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", left+8, y-4, left+30, y-4, l.Color, dash(l.Dashes))
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" font-size="11" %s>%s</text>`+"\n", left+36, y, font, esc(l.Label))
		y += lineGap
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ranges returns the axes' ranges: the chart's own, or the data's.
func (c *Chart) ranges() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = c.XMin, c.XMax, c.YMin, c.YMax
	if xmax <= xmin || ymax <= ymin {
		dx0, dx1, dy0, dy1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
		for _, l := range c.Lines {
			for i := range l.X {
				dx0, dx1 = min(dx0, l.X[i]), max(dx1, l.X[i])
				dy0, dy1 = min(dy0, l.Y[i]), max(dy1, l.Y[i])
			}
		}
		if xmax <= xmin {
			xmin, xmax = min(xmin, dx0), dx1
		}
		if ymax <= ymin {
			ymin, ymax = min(ymin, dy0), dy1
		}
	}
	if math.IsInf(xmin, 0) || math.IsInf(xmax, 0) || xmax <= xmin {
		xmin, xmax = 0, 1
	}
	if math.IsInf(ymin, 0) || math.IsInf(ymax, 0) || ymax <= ymin {
		ymin, ymax = 0, 1
	}
	return xmin, xmax, ymin, ymax
}

// Ticks returns round values (1, 2 or 5 times a power of ten apart) from
// lo to hi, about five of them.
func Ticks(lo, hi float64) []float64 {
	raw := (hi - lo) / 5
	if raw <= 0 || math.IsInf(raw, 0) || math.IsNaN(raw) {
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
	var out []float64
	for i := math.Ceil(lo / step); i*step <= hi+step*1e-9; i++ {
		out = append(out, i*step)
	}
	return out
}

// label prints a tick without the float noise of i*step.
func label(v float64) string { return strconv.FormatFloat(math.Round(v*1e9)/1e9, 'f', -1, 64) }

func esc(s string) string { return html.EscapeString(s) }

func dash(d []float64) string {
	if len(d) == 0 {
		return ""
	}
	var s []string
	for _, v := range d {
		s = append(s, label(v))
	}
	return ` stroke-dasharray="` + strings.Join(s, " ") + `"`
}
