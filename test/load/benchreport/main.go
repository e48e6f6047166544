// Command benchreport draws the scaling picture of docs/BENCHMARKS.md from
// `go test -bench` output: BenchmarkScaling's signs/s for 1, 2, 3 and 5
// members (the median of the -count runs) against the ideal, members ×
// 2,000 signs/s.
//
//	go run ./test/load/benchreport -in bench-out/go.txt -svg docs/scaling.svg
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"

	"github.com/hagroup/hagroup/internal/svgplot"
)

// perMember is the model HSM's ceiling: 4 calls at once, 2 ms each.
const perMember = 2000.0

var line = regexp.MustCompile(`^BenchmarkScaling/members=(\d+)-\d+\s.*?\s([0-9.]+) signs/s`)

func main() {
	in := flag.String("in", "bench-out/go.txt", "go test -bench output")
	out := flag.String("svg", "docs/scaling.svg", "picture to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	rates := map[int][]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		v, _ := strconv.ParseFloat(m[2], 64)
		rates[n] = append(rates[n], v)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(rates) == 0 {
		return fmt.Errorf("%s: no BenchmarkScaling results", in)
	}
	var ns []int
	for n := range rates {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	ideal := svgplot.Line{Label: "ideal: members × 2,000/s", Color: svgplot.Color{R: 0x70, G: 0x70, B: 0x70}, Dashes: []float64{4, 3}}
	measured := svgplot.Line{Label: "measured (median)", Color: svgplot.Color{R: 0x1f, G: 0x77, B: 0xb4}, Points: true}
	fmt.Println("members  signs/s (median)  ideal  efficiency")
	for _, n := range ns {
		v := median(rates[n])
		measured.X, measured.Y = append(measured.X, float64(n)), append(measured.Y, v)
		ideal.X, ideal.Y = append(ideal.X, float64(n)), append(ideal.Y, float64(n)*perMember)
		fmt.Printf("%7d  %16.0f  %5.0f  %10.2f\n", n, v, float64(n)*perMember, v/(float64(n)*perMember))
	}
	c := &svgplot.Chart{
		Title:  "Sign throughput through pkg/group: members of fixed 2 ms service time, 4 calls at once",
		XLabel: "members",
		YLabel: "signs per second",
		Width:  768, Height: 432,
		Lines: []svgplot.Line{ideal, measured},
	}
	return c.Save(out)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
