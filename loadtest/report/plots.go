package report

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

var (
	colOffered  = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	colAdmitted = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	colGoodput  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	colCapacity = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	colRedis    = color.RGBA{R: 148, G: 103, B: 189, A: 255}
	colDegraded = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	colPhase    = color.RGBA{R: 200, G: 200, B: 200, A: 255}
	configCols  = map[string]color.Color{
		"none":   color.RGBA{R: 214, G: 39, B: 40, A: 255},
		"naive":  color.RGBA{R: 255, G: 127, B: 14, A: 255},
		"static": color.RGBA{R: 31, G: 119, B: 180, A: 255},
		"full":   color.RGBA{R: 44, G: 160, B: 44, A: 255},
	}
)

func xy(xs, ys []float64) plotter.XYs {
	pts := make(plotter.XYs, min(len(xs), len(ys)))
	for i := range pts {
		pts[i].X, pts[i].Y = xs[i], ys[i]
	}
	return pts
}

// centers returns the middle of each bucket, where its value belongs.
func centers(s *sim.Series) []float64 {
	out := make([]float64, len(s.T))
	for i, t := range s.T {
		out[i] = t + s.BucketSec/2
	}
	return out
}

func addLine(p *plot.Plot, name string, pts plotter.XYs, c color.Color, width vg.Length, dashed bool) {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return
	}
	l.Color = c
	l.Width = width
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
}

// addPhases draws the phase boundaries; withNames labels them too.
func addPhases(p *plot.Plot, phases []sim.Phase, top float64, withNames bool) {
	for _, ph := range phases[1:] {
		addLine(p, "", plotter.XYs{{X: ph.StartSec, Y: 0}, {X: ph.StartSec, Y: top}}, colPhase, vg.Points(1), true)
	}
	if !withNames {
		return
	}
	var pts plotter.XYs
	var names []string
	for _, ph := range phases {
		pts = append(pts, plotter.XY{X: ph.StartSec + 0.1, Y: top * 0.97})
		names = append(names, ph.Name)
	}
	if lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: names}); err == nil {
		for i := range lb.TextStyle {
			lb.TextStyle[i].Font.Size = vg.Points(8)
			lb.TextStyle[i].Color = color.RGBA{R: 90, G: 90, B: 90, A: 255}
		}
		p.Add(lb)
	}
}

func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.Y.Label.Text = ylabel
	p.X.Label.Text = "time (s)"
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	return p
}

func maxSeries(xs ...[]float64) float64 {
	m := 1.0
	for _, x := range xs {
		for _, v := range x {
			m = max(m, v)
		}
	}
	return m
}

// capacitySteps is the database's capacity over the run (scaled by per),
// as a step line following the phases.
func capacitySteps(phases []sim.Phase, per float64) plotter.XYs {
	var pts plotter.XYs
	for _, ph := range phases {
		v := float64(ph.Capacity) * per
		pts = append(pts, plotter.XY{X: ph.StartSec, Y: v}, plotter.XY{X: ph.EndSec, Y: v})
	}
	return pts
}

// concAxisTop is the top of a concurrency axis: the data's peak, but at
// most 3× the capacity, so that a configuration that stays near the
// capacity is not flattened under one that ran away (the lines are cut
// at the top, and the title says so).
func concAxisTop(peak float64, capacity int) (top float64, cut bool) {
	limit := 3 * float64(capacity)
	if peak*1.1 > limit {
		return limit, true
	}
	return max(peak, float64(capacity)) * 1.1, false
}

// plotConfiguration draws one configuration's time series as five stacked
// panels: load, backend concurrency, latencies, degraded decisions and
// breakers.
func plotConfiguration(sc *scenario.ScenarioResult, c *scenario.ConfigResult, path string) error {
	s := c.Series
	x := centers(s)
	capRPS := c.BackendCapacityRPS
	end := sc.DurationSeconds

	load := newPlot(fmt.Sprintf("%s — %s: requests/s", sc.Name, c.Title), "req/s")
	top := maxSeries(s.Offered, []float64{capRPS}) * 1.1
	addPhases(load, sc.Phases, top, true)
	addLine(load, "offered (incl. retries)", xy(x, s.Offered), colOffered, vg.Points(1), false)
	addLine(load, "admitted", xy(x, s.Admitted), colAdmitted, vg.Points(1.5), false)
	addLine(load, "goodput", xy(x, s.Goodput), colGoodput, vg.Points(2), false)
	addLine(load, "backend capacity", capacitySteps(sc.Phases, capRPS/float64(c.BackendCapacity)), colCapacity, vg.Points(1), true)
	load.Y.Min, load.Y.Max = 0, top

	ctop, cut := concAxisTop(maxSeries(s.BackendConc), c.BackendCapacity)
	title := "backend concurrency (peak per bucket)"
	if cut {
		title += "; axis cut at 3× capacity"
	}
	conc := newPlot(title, "in flight")
	addPhases(conc, sc.Phases, ctop, false)
	addLine(conc, "backend concurrency", xy(x, s.BackendConc), colAdmitted, vg.Points(1.5), false)
	addLine(conc, "capacity", capacitySteps(sc.Phases, 1), colCapacity, vg.Points(1), true)
	conc.Y.Min, conc.Y.Max = 0, ctop

	// Redis: the worst PING per bucket that was answered, and the buckets
	// where a PING got no answer within the probe's timeout marked on top,
	// so that slow (answers at 600 ms) and down (no answers) differ.
	lat := newPlot("latency (ms); × = a Redis PING unanswered within 1 s", "ms")
	ltop := maxSeries(s.BackendP99, s.RedisMS) * 1.1
	addPhases(lat, sc.Phases, ltop, false)
	addLine(lat, "backend p99", xy(x, s.BackendP99), colAdmitted, vg.Points(1.5), false)
	addLine(lat, "Redis PING (worst answered per bucket)", xy(x, s.RedisMS), colRedis, vg.Points(1.5), false)
	var down plotter.XYs
	for i, n := range s.RedisDown {
		if n > 0 {
			down = append(down, plotter.XY{X: x[i], Y: ltop * 0.95})
		}
	}
	if len(down) > 0 {
		if sp, err := plotter.NewScatter(down); err == nil {
			sp.Color = colRedis
			sp.Shape = draw.CrossGlyph{}
			lat.Add(sp)
			lat.Legend.Add("Redis PING unanswered", sp)
		}
	}
	lat.Y.Min, lat.Y.Max = 0, ltop

	deg := newPlot("degraded decisions and store errors", "per s")
	dtop := maxSeries(s.Degraded, s.StoreErrors) * 1.1
	addPhases(deg, sc.Phases, dtop, false)
	addLine(deg, "degraded decisions/s", xy(x, s.Degraded), colDegraded, vg.Points(1.5), false)
	addLine(deg, "store errors/s (fail-open)", xy(x, s.StoreErrors), colCapacity, vg.Points(1), false)
	deg.Y.Min, deg.Y.Max = 0, dtop

	br := newPlot("circuit breakers not closed (servers)", "servers")
	btop := maxSeries(s.BreakersOpen) * 1.1
	addPhases(br, sc.Phases, btop, false)
	addLine(br, "breakers open or half-open", xy(x, s.BreakersOpen), colRedis, vg.Points(1.5), false)
	br.Y.Min, br.Y.Max = 0, btop

	for _, p := range []*plot.Plot{load, conc, lat, deg, br} {
		p.X.Min, p.X.Max = 0, end
	}
	return savePanels(path, []*plot.Plot{load, conc, lat, deg, br}, 2.1)
}

// plotComparison overlays the configurations' goodput and backend
// concurrency.
func plotComparison(sc *scenario.ScenarioResult, path string) error {
	good := newPlot(sc.Name+": goodput per configuration", "req/s")
	conc := newPlot("backend concurrency per configuration", "in flight")
	var gtop, ctop float64
	for _, name := range sc.Order {
		c := sc.Configurations[name]
		gtop = max(gtop, maxSeries(c.Series.Goodput, []float64{c.BackendCapacityRPS}))
		ctop = max(ctop, maxSeries(c.Series.BackendConc, []float64{float64(c.BackendCapacity)}))
	}
	gtop *= 1.1
	capacity := 0
	if len(sc.Order) > 0 {
		capacity = sc.Configurations[sc.Order[0]].BackendCapacity
	}
	ctop, cut := concAxisTop(ctop, capacity)
	if cut {
		conc.Title.Text += " (axis cut at 3× capacity)"
	}
	addPhases(good, sc.Phases, gtop, true)
	addPhases(conc, sc.Phases, ctop, false)
	for _, name := range sc.Order {
		c := sc.Configurations[name]
		x := centers(c.Series)
		addLine(good, name, xy(x, c.Series.Goodput), configCols[name], vg.Points(1.5), false)
		addLine(conc, name, xy(x, c.Series.BackendConc), configCols[name], vg.Points(1.5), false)
	}
	if len(sc.Order) > 0 {
		c := sc.Configurations[sc.Order[0]]
		addLine(good, "capacity", capacitySteps(sc.Phases, c.BackendCapacityRPS/float64(c.BackendCapacity)), color.Black, vg.Points(1), true)
		addLine(conc, "capacity", capacitySteps(sc.Phases, 1), color.Black, vg.Points(1), true)
	}
	good.Y.Min, good.Y.Max = 0, gtop
	conc.Y.Min, conc.Y.Max = 0, ctop
	good.X.Min, good.X.Max = 0, sc.DurationSeconds
	conc.X.Min, conc.X.Max = 0, sc.DurationSeconds
	return savePanels(path, []*plot.Plot{good, conc}, 2.6)
}

// plotGoodputCurves draws goodput and Critical p99 against offered load.
func plotGoodputCurves(sc *scenario.ScenarioResult, path string) error {
	good := newPlot("goodput vs offered load", "goodput (× capacity)")
	crit := newPlot("Critical p99 latency vs offered load", "ms")
	good.X.Label.Text = "offered load (× capacity)"
	crit.X.Label.Text = "offered load (× capacity)"
	for _, name := range sc.Order {
		c := sc.Configurations[name]
		var g, l plotter.XYs
		for k, ph := range c.Phases {
			lv := scenario.GoodputLevels[k]
			g = append(g, plotter.XY{X: lv, Y: ph.GoodputRPS / c.BackendCapacityRPS})
			if ph.CriticalP99MS > 0 { // no point where no Critical request succeeded
				l = append(l, plotter.XY{X: lv, Y: ph.CriticalP99MS})
			}
		}
		addLine(good, name, g, configCols[name], vg.Points(2), false)
		if len(l) > 0 {
			addLine(crit, name, l, configCols[name], vg.Points(2), false)
		}
		if sp, err := plotter.NewScatter(g); err == nil {
			sp.Color = configCols[name]
			good.Add(sp)
		}
		if sp, err := plotter.NewScatter(l); err == nil && len(l) > 0 {
			sp.Color = configCols[name]
			crit.Add(sp)
		}
	}
	addLine(good, "capacity", plotter.XYs{{X: scenario.GoodputLevels[0], Y: 1}, {X: scenario.GoodputLevels[len(scenario.GoodputLevels)-1], Y: 1}}, color.Black, vg.Points(1), true)
	good.Y.Min = 0
	crit.Y.Min = 0
	return savePanels(path, []*plot.Plot{good, crit}, 2.8)
}

func savePanels(path string, ps []*plot.Plot, panelInches float64) error {
	w := 9 * vg.Inch
	h := vg.Length(panelInches*float64(len(ps))) * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	rows := make([][]*plot.Plot, len(ps))
	for i, p := range ps {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(ps), Cols: 1, PadY: vg.Points(6), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align(rows, tiles, dc)
	for i, p := range ps {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loadtest: plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("loadtest: plot %s: %w", filepath.Base(path), err)
	}
	return f.Close()
}

// plotWindowErrors plots, for each population, the share of decisions
// that differ from the exact log against N, one line per mode, the
// counter as a dashed level.
func plotWindowErrors(rows []scenario.WindowAccuracy, path string) error {
	var pops []string
	for _, r := range rows {
		if !slices.Contains(pops, r.Population) {
			pops = append(pops, r.Population)
		}
	}
	var ps []*plot.Plot
	for _, pop := range pops {
		p := plot.New()
		p.Title.Text = "decisions that differ from the exact log, sources at " + pop + " the limit"
		p.Title.TextStyle.Font.Size = vg.Points(10)
		p.X.Label.Text = "N (sub-windows per period, log scale)"
		p.Y.Label.Text = "% of decisions"
		p.X.Scale = plot.LogScale{}
		var ticks []plot.Tick
		for _, r := range rows {
			if r.Population == pop && r.Contender == "buckets" && r.Mode == "interpolated" {
				ticks = append(ticks, plot.Tick{Value: float64(r.Buckets), Label: strconv.FormatInt(r.Buckets, 10)})
			}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
		lines := map[string]plotter.XYs{}
		var counter float64
		for _, r := range rows {
			if r.Population != pop {
				continue
			}
			if r.Contender == "counter" {
				counter = 100 * r.Differ
				continue
			}
			lines[r.Mode] = append(lines[r.Mode], plotter.XY{X: float64(r.Buckets), Y: 100 * r.Differ})
		}
		for i, mode := range []string{"interpolated", "conservative"} {
			l, pts, err := plotter.NewLinePoints(lines[mode])
			if err != nil {
				return fmt.Errorf("loadtest: plot: %w", err)
			}
			c := []color.Color{colAdmitted, colCapacity}[i]
			l.Color, pts.Color = c, c
			p.Add(l, pts)
			p.Legend.Add("buckets, "+mode, l, pts)
		}
		if xs := lines["interpolated"]; len(xs) > 0 {
			l, err := plotter.NewLine(plotter.XYs{{X: xs[0].X, Y: counter}, {X: xs[len(xs)-1].X, Y: counter}})
			if err == nil {
				l.Color, l.Dashes = colOffered, []vg.Length{vg.Points(4), vg.Points(3)}
				p.Add(l)
				p.Legend.Add("sliding window counter", l)
			}
		}
		p.Y.Min = 0
		ps = append(ps, p)
	}
	return savePanels(path, ps, 3)
}
