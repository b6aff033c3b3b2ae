package main

// The figures: two SVG files drawn from the run's own results, written
// beside the report, so that a picture never comes from another run than
// the tables it sits with. Hand-written SVG, the standard library only.

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	// hotFigureScenario is the contended run the hot-key figure draws: one
	// hot key, 4 Clients × 16 goroutines, 200 µs critical section.
	hotFigureScenario = "hot200"
	// The figures' file names; docs/BENCHMARKS.md shows them by these names.
	hotKeyFigure = "bench-hotkey.svg"
	httpFigure   = "bench-http.svg"
)

// writeFigures writes the figures of the scenarios the run measured into
// dir, each file replaced whole, and returns the paths written.
func writeFigures(dir string, cfg config, m machine, r *results) ([]string, error) {
	caption := figureCaption(cfg, m)
	var written []string
	write := func(name string, draw func(io.Writer) error) error {
		var b bytes.Buffer
		if err := draw(&b); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		path := filepath.Join(dir, name)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			_ = os.Remove(tmp)
			return err
		}
		written = append(written, path)
		return nil
	}
	if cfg.scenarios["hot"] {
		series := hotKeySeries(r)
		if err := write(hotKeyFigure, func(w io.Writer) error { return hotKeySVG(w, series, caption) }); err != nil {
			return written, err
		}
	}
	if cfg.scenarios["http"] {
		bars := httpBars(r)
		if err := write(httpFigure, func(w io.Writer) error { return httpSVG(w, bars, cfg.httpClients, caption) }); err != nil {
			return written, err
		}
	}
	return written, nil
}

// checkFigureDir fails when dir cannot take the figures, before the run
// spends minutes measuring.
func checkFigureDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("-figures: %w (it is relative to the working directory, bench/ for go -C bench run .; -figures \"\" writes none)", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("-figures %s: not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".bench-figures-*")
	if err != nil {
		return fmt.Errorf("-figures %s: cannot write there: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// figureCaption says which run drew a figure.
func figureCaption(cfg config, m machine) string {
	rounds := "1 round"
	if cfg.rounds != 1 {
		rounds = strconv.Itoa(cfg.rounds) + " rounds"
	}
	return fmt.Sprintf("%s (seckillguard at %s), %s, %s; %d × %s.", m.command, m.revision, m.date, rounds, m.cpus, m.model)
}

// ---- the hot key: how long the waits took ----

// cdfSeries is one library's waits on the hot key, every round's pooled.
type cdfSeries struct {
	name       string
	ended      []time.Duration // sorted
	cut        []time.Duration // sorted: the waits still going on when the run ended
	p99        float64         // ms: the table's wait p99 (median over rounds)
	unserved   float64         // the table's goroutines never served (median over rounds)
	goroutines int
}

// hotKeySeries gathers the hot-key figure's series, one per library in the
// contended runs, in the tables' order.
func hotKeySeries(r *results) []cdfSeries {
	var ld load
	for _, sc := range contendedScenarios(config{}) {
		if sc.id == hotFigureScenario {
			ld = sc.ld
		}
	}
	var out []cdfSeries
	for _, c := range lockers(contenders()) {
		s := cdfSeries{name: c.name, p99: median(r.get(hotFigureScenario, c.name, "p99")),
			unserved: median(r.get(hotFigureScenario, c.name, "unserved")), goroutines: ld.clients * ld.goroutines}
		if w := r.waits[c.name]; w != nil {
			s.ended = sortDurations(append([]time.Duration(nil), w.ended...))
			s.cut = sortDurations(append([]time.Duration(nil), w.cut...))
		}
		out = append(out, s)
	}
	return out
}

// seriesStyle is how a row is drawn: this framework's locks in blue, the
// peers in colours of their own (Okabe–Ito, readable with colour-blindness),
// the floor in grey.
func seriesStyle(name string) (colour string, strokeWidth float64, dash string) {
	switch name {
	case "seckillguard":
		return "#0072B2", 3, ""
	case "seckillguard (fair)":
		return "#56B4E9", 2, ""
	case "redsync (defaults)":
		return "#D55E00", 2, ""
	case "redsync (tuned)":
		return "#E69F00", 2, "7 3"
	case "bsm/redislock":
		return "#CC79A7", 2, ""
	case "floor":
		return "#777777", 1.5, "3 3"
	}
	return "#000000", 1.5, "1 2"
}

// hotKeySVG draws, per library, the share of the waits that had ended
// within each time: x the wait on a log scale, y the share on a percentile
// ("nines") scale, so that the tail — where the libraries differ — gets as
// much room as the body. A library whose waiters were still waiting when the
// run ended stops short of 100%, and a dotted line carries its last level to
// the right edge.
func hotKeySVG(w io.Writer, series []cdfSeries, caption string) error {
	const (
		width       = 820.0
		left, right = 88.0, 32.0
		top         = 86.0
		plotH       = 330.0
		lineH       = 16.0
	)
	plotW := width - left - right

	lo, hi, maxN := math.Inf(1), 0.0, 10
	for _, s := range series {
		if len(s.ended) > 0 {
			lo = min(lo, msOf(s.ended[0]))
			hi = max(hi, msOf(s.ended[len(s.ended)-1]))
		}
		if len(s.cut) > 0 {
			hi = max(hi, msOf(s.cut[len(s.cut)-1]))
		}
		maxN = max(maxN, len(s.ended)+len(s.cut))
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.01, 1000
	}
	x0 := math.Floor(math.Log10(max(lo, 0.001)))
	x1 := math.Max(math.Ceil(math.Log10(max(hi, lo))), x0+1)
	X := func(ms float64) float64 {
		return left + (math.Log10(max(ms, math.Pow(10, x0)))-x0)/(x1-x0)*plotW
	}
	// The top tick is 1 - 10^-nines, as many nines as the samples can
	// tell apart; 100% (every wait ended) sits above it.
	nines := math.Max(2, math.Ceil(math.Log10(float64(maxN))))
	all := nines + 0.6
	Y := func(f float64) float64 {
		n := all
		if f < 1 {
			n = math.Min(-math.Log10(1-f), nines)
		}
		return top + plotH - n/all*plotH
	}

	var legend [][]string // per series: its lines
	for _, s := range series {
		legend = append(legend, cdfLegend(s))
	}
	legendTop := top + plotH + 64
	height := legendTop
	for _, l := range legend {
		height += float64(len(l))*lineH + 8
	}
	capLines := wrapText(caption, 118)
	height += 12 + float64(len(capLines))*14 + 8

	s := newSVG(width, height)
	s.text(left, 28, "start", 17, "bold", "Waiting for one hot key: how long the waits took, per library")
	s.text(left, 48, "start", 12.5, "", "4 Clients × 16 goroutines lock one key in a loop, 200 µs inside; every wait of every round, pooled.")
	s.text(left, 65, "start", 12.5, "", "A curve that stops below 100% had waiters still waiting when the run ended (dotted to the edge).")

	// Grid and axes.
	for k := x0; k <= x1; k++ {
		x := X(math.Pow(10, k))
		s.line(x, top, x, top+plotH, "#dddddd", 1, "")
		s.text(x, top+plotH+18, "middle", 12, "", durationLabel(math.Pow(10, k)))
		if k < x1 {
			for m := 2.0; m <= 9; m++ {
				xm := X(m * math.Pow(10, k))
				s.line(xm, top+plotH, xm, top+plotH+4, "#999999", 1, "")
			}
		}
	}
	ticks := []struct {
		f     float64
		label string
	}{{0, "0%"}, {0.5, "50%"}, {0.9, "90%"}, {0.99, "99%"}, {0.999, "99.9%"}, {0.9999, "99.99%"}, {0.99999, "99.999%"}}
	for _, t := range ticks {
		if t.f > 0 && -math.Log10(1-t.f) > nines+1e-9 {
			break
		}
		y := Y(t.f)
		s.line(left, y, left+plotW, y, "#dddddd", 1, "")
		s.text(left-8, y+4, "end", 12, "", t.label)
	}
	yAll := Y(1)
	s.line(left, yAll, left+plotW, yAll, "#999999", 1, "4 3")
	s.text(left-8, yAll+4, "end", 12, "bold", "100%")
	s.rect(left, top, plotW, plotH, "none", "#444444")
	s.text(left+plotW/2, top+plotH+40, "middle", 13, "", "wait: from calling Lock to holding the lock (log scale)")
	s.textRotated(22, top+plotH/2, 13, "waits ended within that time (percentile scale)")

	// The curves, the slowest library drawn first so that this framework's
	// curve lies on top.
	for i := len(series) - 1; i >= 0; i-- {
		sr := series[i]
		colour, sw, dash := seriesStyle(sr.name)
		s.openGroup("series", sr.name)
		n := len(sr.ended) + len(sr.cut)
		var p strings.Builder
		lastX, lastY := X(0), Y(0)
		if len(sr.ended) > 0 {
			lastX = X(msOf(sr.ended[0]))
			fmt.Fprintf(&p, "M%.1f %.1f", lastX, lastY)
			for j, d := range sr.ended {
				x, y := X(msOf(d)), Y(float64(j+1)/float64(n))
				end := j == len(sr.ended)-1
				if x-lastX >= 0.3 || (end && x != lastX) {
					fmt.Fprintf(&p, "H%.1f", x)
					lastX = x
				}
				if lastY-y >= 0.3 || (end && y != lastY) {
					fmt.Fprintf(&p, "V%.1f", y)
					lastY = y
				}
			}
			s.path(p.String(), colour, sw, dash)
		}
		if len(sr.cut) > 0 {
			s.line(lastX, lastY, left+plotW, lastY, colour, sw, "1 4")
		}
		s.closeGroup()
	}

	// The legend.
	y := legendTop
	for i, sr := range series {
		colour, sw, dash := seriesStyle(sr.name)
		s.line(left, y-4, left+34, y-4, colour, sw+0.5, dash)
		for j, l := range legend[i] {
			weight := ""
			if j == 0 {
				weight = "bold"
			}
			s.text(left+44, y+float64(j)*lineH, "start", 12.5, weight, l)
		}
		y += float64(len(legend[i]))*lineH + 8
	}
	y += 12
	for _, l := range capLines {
		s.text(left, y, "start", 11, "", l)
		y += 14
	}
	return s.writeTo(w)
}

// cdfLegend is a series' legend: its name, then what its curve shows,
// including, in words, the waiters it left unserved.
func cdfLegend(s cdfSeries) []string {
	n := len(s.ended) + len(s.cut)
	if n == 0 {
		return []string{s.name, "no waits measured"}
	}
	parts := []string{"no wait ended"}
	if len(s.ended) > 0 {
		parts[0] = "wait p99 " + msLabel(s.p99) + ", the longest that ended " + msLabel(msOf(s.ended[len(s.ended)-1]))
	}
	switch {
	case len(s.cut) == 0 && s.unserved == 0:
		parts = append(parts, "every wait ended, every goroutine served")
	default:
		if s.unserved > 0 {
			parts = append(parts, fmt.Sprintf("%s of %d goroutines never served in a round (median)", strconv.FormatFloat(s.unserved, 'f', -1, 64), s.goroutines))
		}
		if len(s.cut) > 0 {
			parts = append(parts, fmt.Sprintf("%s of %s waits never ended, the longest at %s when the run stopped: the curve ends at %s",
				thousands(float64(len(s.cut))), thousands(float64(n)), msLabel(msOf(s.cut[len(s.cut)-1])), percentLabel(float64(len(s.ended))/float64(n))))
		}
	}
	return append([]string{s.name}, wrapText(strings.Join(parts, "; "), 100)...)
}

// ---- the HTTP rows: requests per second per mode ----

// httpBar is one mode's requests per second over the rounds.
type httpBar struct {
	shape, row  string // the shape's title ("one SKU") and the row's name
	med, lo, hi float64
	vsNone      float64 // median over rounds of the ratio to none in the same round; NaN for none
	ok          bool
}

// httpBars gathers the HTTP figure's bars, shape by shape, in the tables'
// order.
func httpBars(r *results) []httpBar {
	var out []httpBar
	for _, sh := range httpShapes {
		for _, row := range httpRows {
			b := httpBar{shape: sh.title, row: row.name, vsNone: math.NaN()}
			b.med, b.lo, b.hi, b.ok = stats(r.get(sh.id, row.name, "rps"))
			if d := median(r.get(sh.id, row.name, "drps")); !math.IsNaN(d) {
				b.vsNone = 1 + d/100
			}
			out = append(out, b)
		}
	}
	return out
}

// barColour gives the guard's modes the hot-key figure's blue.
func barColour(row string) string {
	switch row {
	case "none":
		return "#8c8c8c"
	case "local":
		return "#bdbdbd"
	case "guard":
		return "#0072B2"
	case "guard, with Idempotency-Key":
		return "#56B4E9"
	case "guard-combine":
		return "#009E73"
	}
	return "#444444"
}

// httpSVG draws the HTTP rows as bars, one panel per shape (one SKU, 1,024
// SKUs), on one scale: the median over rounds, a whisker from the slowest
// round to the fastest, and the ratio to none.
func httpSVG(w io.Writer, bars []httpBar, clients int, caption string) error {
	const (
		width     = 820.0
		labelX    = 24.0
		left      = 232.0
		right     = 170.0
		top       = 84.0
		rowH      = 26.0
		barH      = 16.0
		panelHead = 26.0
		panelGap  = 14.0
	)
	plotW := width - left - right
	var shapes []string
	byShape := map[string][]httpBar{}
	hi := 0.0
	for _, b := range bars {
		if _, seen := byShape[b.shape]; !seen {
			shapes = append(shapes, b.shape)
		}
		byShape[b.shape] = append(byShape[b.shape], b)
		if b.ok {
			hi = max(hi, b.hi)
		}
	}
	step := niceStep(hi/5, 1)
	xmax := math.Max(step, math.Ceil(hi/step)*step)
	X := func(v float64) float64 { return left + v/xmax*plotW }

	plotH := 0.0
	for _, sh := range shapes {
		plotH += panelHead + float64(len(byShape[sh]))*rowH + panelGap
	}
	capLines := wrapText(caption, 118)
	height := top + plotH + 48 + float64(len(capLines))*14 + 8

	s := newSVG(width, height)
	s.text(labelX, 28, "start", 17, "bold", "The whole HTTP path: requests per second through the reference service")
	s.text(labelX, 48, "start", 12.5, "", fmt.Sprintf("%d clients in a closed loop, every request a purchase by a new buyer; bars: the median over rounds,", clients))
	s.text(labelX, 65, "start", 12.5, "", "the whisker from the slowest round to the fastest; × none: the median of each round's ratio to none.")

	for k := 0.0; k <= xmax+step/2; k += step {
		x := X(k)
		s.line(x, top, x, top+plotH, "#e3e3e3", 1, "")
		s.text(x, top+plotH+16, "middle", 12, "", thousands(k))
	}
	s.text(left+plotW/2, top+plotH+36, "middle", 13, "", "requests per second")

	y := top
	for _, sh := range shapes {
		s.text(labelX, y+17, "start", 13.5, "bold", sh)
		y += panelHead
		for _, b := range byShape[sh] {
			s.openGroup("bar", sh+": "+b.row)
			cy := y + rowH/2
			s.text(left-10, cy+4, "end", 12.5, "", b.row)
			if !b.ok {
				s.text(left+6, cy+4, "start", 12, "", "no result")
				s.closeGroup()
				y += rowH
				continue
			}
			s.rect(left, cy-barH/2, X(b.med)-left, barH, barColour(b.row), "none")
			if b.hi > b.lo {
				s.line(X(b.lo), cy, X(b.hi), cy, "#222222", 1.2, "")
				s.line(X(b.lo), cy-4, X(b.lo), cy+4, "#222222", 1.2, "")
				s.line(X(b.hi), cy-4, X(b.hi), cy+4, "#222222", 1.2, "")
			}
			label := thousands(b.med) + "/s"
			if !math.IsNaN(b.vsNone) {
				label += fmt.Sprintf(" · %.2f× none", b.vsNone)
			}
			s.text(math.Max(X(b.med), X(b.hi))+8, cy+4, "start", 12, "", label)
			s.closeGroup()
			y += rowH
		}
		y += panelGap
	}
	y = top + plotH + 48 + 10
	for _, l := range capLines {
		s.text(labelX, y, "start", 11, "", l)
		y += 14
	}
	return s.writeTo(w)
}

// niceStep is the smallest of 1, 2 or 5 × a power of ten that is at least
// v (and at least floor).
func niceStep(v, floor float64) float64 {
	v = math.Max(v, floor)
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// ---- SVG writing ----

// svg collects the elements of one SVG document.
type svg struct {
	b bytes.Buffer
}

func newSVG(width, height float64) *svg {
	s := &svg{}
	fmt.Fprintf(&s.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" fill="#222222">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&s.b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	return s
}

func (s *svg) text(x, y float64, anchor string, size float64, weight, content string) {
	w := ""
	if weight != "" {
		w = ` font-weight="` + weight + `"`
	}
	fmt.Fprintf(&s.b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%.1f"%s>%s</text>`+"\n", x, y, anchor, size, w, escapeXML(content))
}

func (s *svg) textRotated(x, y, size float64, content string) {
	fmt.Fprintf(&s.b, `<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle" font-size="%.1f">%s</text>`+"\n", x, y, size, escapeXML(content))
}

func (s *svg) line(x1, y1, x2, y2 float64, colour string, width float64, dash string) {
	d := ""
	if dash != "" {
		d = ` stroke-dasharray="` + dash + `"`
	}
	fmt.Fprintf(&s.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`+"\n", x1, y1, x2, y2, colour, width, d)
}

func (s *svg) rect(x, y, w, h float64, fill, stroke string) {
	fmt.Fprintf(&s.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="%s"/>`+"\n", x, y, max(w, 0), h, fill, stroke)
}

func (s *svg) path(d, colour string, width float64, dash string) {
	ds := ""
	if dash != "" {
		ds = ` stroke-dasharray="` + dash + `"`
	}
	fmt.Fprintf(&s.b, `<path d="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"%s/>`+"\n", d, colour, width, ds)
}

// openGroup starts a group of one kind (class) for one named thing; its
// title is what a browser shows on hover.
func (s *svg) openGroup(class, name string) {
	fmt.Fprintf(&s.b, `<g class="%s" data-name="%s"><title>%s</title>`+"\n", class, escapeXML(name), escapeXML(name))
}

func (s *svg) closeGroup() { s.b.WriteString("</g>\n") }

func (s *svg) writeTo(w io.Writer) error {
	s.b.WriteString("</svg>\n")
	_, err := w.Write(s.b.Bytes())
	return err
}

// escapeXML escapes text for an element's content or an attribute value.
func escapeXML(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ---- labels ----

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// durationLabel names a decade of milliseconds: "10 µs", "1 ms", "1 s".
func durationLabel(ms float64) string {
	switch {
	case ms >= 1000:
		return strconv.FormatFloat(ms/1000, 'f', -1, 64) + " s"
	case ms >= 1:
		return strconv.FormatFloat(ms, 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(math.Round(ms*1000), 'f', -1, 64) + " µs"
}

// msLabel formats a time in milliseconds with about three digits.
func msLabel(ms float64) string {
	switch {
	case math.IsNaN(ms):
		return "—"
	case ms >= 1000:
		return num(ms/1000) + " s"
	case ms >= 1:
		return num(ms) + " ms"
	}
	return num(ms*1000) + " µs"
}

// percentLabel formats a share below 1 with one decimal, or as many more
// as it takes to tell it from 100%.
func percentLabel(f float64) string {
	for digits := 1; digits < 6; digits++ {
		s := strconv.FormatFloat(f*100, 'f', digits, 64)
		if v, _ := strconv.ParseFloat(s, 64); v < 100 {
			return s + "%"
		}
	}
	return strconv.FormatFloat(f*100, 'f', 6, 64) + "%"
}

// thousands formats v rounded to an integer with thousands separated by
// commas: 12,345.
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Round(math.Abs(v)), 'f', 0, 64)
	var b strings.Builder
	if v < 0 && s != "0" {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// wrapText breaks text into lines of at most width characters at spaces.
func wrapText(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len([]rune(line))+1+len([]rune(word)) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
