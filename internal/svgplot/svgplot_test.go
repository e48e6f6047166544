package svgplot

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []float64
	}{
		{0, 10, []float64{0, 2, 4, 6, 8, 10}},
		{0, 7000, []float64{0, 2000, 4000, 6000}},
		{0, 1, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
		{3, 3, nil},
		{0, 2432, []float64{0, 500, 1000, 1500, 2000}},
		{0, 9000, []float64{0, 2000, 4000, 6000, 8000}},
		{0, 160, []float64{0, 50, 100, 150}},
	} {
		got := Ticks(c.lo, c.hi)
		if len(got) != len(c.want) {
			t.Errorf("Ticks(%g, %g) = %v, want %v", c.lo, c.hi, got, c.want)
			continue
		}
		for i := range got {
			if label(got[i]) != label(c.want[i]) {
				t.Errorf("Ticks(%g, %g) = %v, want %v", c.lo, c.hi, got, c.want)
			}
		}
	}
	if got := label(3 * 0.1); got != "0.3" {
		t.Errorf("label(0.30000000000000004) = %q", got)
	}
}

// TestChartIsSVG reads the picture back as XML and finds what was drawn.
func TestChartIsSVG(t *testing.T) {
	c := &Chart{
		Title: "a <test> & more", XLabel: "seconds\nsecond line", YLabel: "rate", Width: 800, Height: 400,
		Lines: []Line{
			{Label: "hsm-a", X: []float64{0, 1, 2}, Y: []float64{5, 7, 6}, Color: Color{R: 0x1f}},
			{Label: "ideal", X: []float64{0, 2}, Y: []float64{0, 10}, Dashes: []float64{4, 3}, Points: true},
		},
		Marks: []Mark{{X: 1, Label: "kill -9 hsm-a", Color: Color{R: 0xd6}, LabelY: 0.9}},
	}
	path := filepath.Join(t.TempDir(), "c.svg")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var texts []string
	elems := map[string]int{}
	d := xml.NewDecoder(f)
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch v := tok.(type) {
		case xml.StartElement:
			elems[v.Name.Local]++
		case xml.CharData:
			if s := strings.TrimSpace(string(v)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	for _, want := range []string{"a <test> & more", "seconds", "second line", "rate", "hsm-a", "ideal", "kill -9 hsm-a", "10"} {
		if !slices.Contains(texts, want) {
			t.Errorf("text %q not in the picture: %q", want, texts)
		}
	}
	if elems["polyline"] != 2 || elems["circle"] != 2 || elems["svg"] != 1 {
		t.Errorf("drawn: %v, want 2 polylines, 2 circles, 1 svg", elems)
	}
}

func TestTooSmall(t *testing.T) {
	if err := (&Chart{Width: 50, Height: 50}).Write(io.Discard); err == nil {
		t.Fatal("a 50x50 chart has no room for its plot, yet Write succeeded")
	}
}
