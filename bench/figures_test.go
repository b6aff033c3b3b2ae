package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// svgDoc is what the tests read back from a figure.
type svgDoc struct {
	texts  []string
	groups map[string][]string // class → data-name of each group, in order
	// per group (class "series"): its path's d and whether it has a dotted line
	paths  map[string]string
	dotted map[string]bool
	all100 float64 // y of the "100%" label's line
}

// parseSVG decodes a figure as XML, failing on anything that is not
// well-formed, and collects its texts and groups.
func parseSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	doc := svgDoc{groups: map[string][]string{}, paths: map[string]string{}, dotted: map[string]bool{}, all100: math.NaN()}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	var (
		depth   int
		root    string
		group   string
		inText  bool
		textY   float64
		content strings.Builder
	)
	attr := func(e xml.StartElement, name string) string {
		for _, a := range e.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, data)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = e.Name.Local
				if e.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root element in namespace %q, want SVG's", e.Name.Space)
				}
			}
			depth++
			switch e.Name.Local {
			case "g":
				group = attr(e, "data-name")
				doc.groups[attr(e, "class")] = append(doc.groups[attr(e, "class")], group)
			case "path":
				if group != "" {
					doc.paths[group] = attr(e, "d")
				}
			case "line":
				if group != "" && attr(e, "stroke-dasharray") == "1 4" {
					doc.dotted[group] = true
				}
			case "text":
				inText = true
				textY, _ = strconv.ParseFloat(attr(e, "y"), 64)
				content.Reset()
			}
		case xml.CharData:
			if inText {
				content.Write(e)
			}
		case xml.EndElement:
			depth--
			switch e.Name.Local {
			case "g":
				group = ""
			case "text":
				inText = false
				doc.texts = append(doc.texts, content.String())
				if content.String() == "100%" {
					doc.all100 = textY - 4
				}
			}
		}
	}
	if root != "svg" || depth != 0 {
		t.Fatalf("root element %q, depth at the end %d", root, depth)
	}
	return doc
}

// hasText reports whether sub is in the figure's texts, lines joined by a
// space (a legend wraps).
func (d svgDoc) hasText(sub string) bool {
	return strings.Contains(strings.Join(d.texts, " "), sub)
}

// lastV returns the y of a path's last vertical step.
func lastV(t *testing.T, d string) float64 {
	t.Helper()
	i := strings.LastIndex(d, "V")
	if i < 0 {
		t.Fatalf("path %q has no vertical step", d)
	}
	end := strings.IndexAny(d[i+1:], "MHV")
	if end < 0 {
		end = len(d) - i - 1
	}
	v, err := strconv.ParseFloat(d[i+1:i+1+end], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// figureResults is a run's results as measure would leave them: waits for
// every library on the hot key (bsm/redislock's with waiters cut short by
// the end of the run), requests/s for every HTTP row.
func figureResults() *results {
	r := newResults()
	for i, c := range lockers(contenders()) {
		var waits, cut []time.Duration
		for j := range 2000 {
			// Waits from 20 µs to ~2 s, a different spread per library.
			ms := 0.02 * math.Pow(10, 5*float64(j)/2000) * float64(i+1) / 3
			waits = append(waits, time.Duration(ms*float64(time.Millisecond)))
		}
		if c.name == "bsm/redislock" {
			cut = []time.Duration{1500 * time.Millisecond, 1800 * time.Millisecond}
			waits = append(waits, cut...)
			r.add(hotFigureScenario, c.name, "unserved", 12)
		} else {
			r.add(hotFigureScenario, c.name, "unserved", 0)
		}
		sortDurations(waits)
		r.keepWaits(c.name, waits, cut)
		r.add(hotFigureScenario, c.name, "p99", percentile(waits, 99)/1e6)
	}
	for _, sh := range httpShapes {
		for k, row := range httpRows {
			for round := range 3 {
				r.add(sh.id, row.name, "rps", float64(3000-400*k+50*round))
				if k > 0 {
					r.add(sh.id, row.name, "drps", -float64(10*k))
				}
			}
		}
	}
	return r
}

// TestHotKeySVG_ASeriesPerLibraryAndTheUnservedShown: the hot-key figure is
// well-formed SVG with one curve per library of the contended runs, axes
// labelled, and a library that left waits unended stops short of 100%, with
// a dotted line and its legend saying so; the others reach 100%.
func TestHotKeySVG_ASeriesPerLibraryAndTheUnservedShown(t *testing.T) {
	var b bytes.Buffer
	if err := hotKeySVG(&b, hotKeySeries(figureResults()), "go -C bench run . (test)"); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	var want []string
	for _, c := range lockers(contenders()) {
		want = append(want, c.name)
	}
	got := slices.Clone(doc.groups["series"])
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("series %q, want one per library %q", got, want)
	}
	for _, label := range []string{"wait: from calling Lock to holding the lock (log scale)", "waits ended within that time (percentile scale)", "1 ms", "1 s", "99%", "100%"} {
		if !doc.hasText(label) {
			t.Errorf("no axis text %q in %q", label, doc.texts)
		}
	}
	if math.IsNaN(doc.all100) {
		t.Fatal("no 100% line")
	}
	for _, name := range want {
		y := lastV(t, doc.paths[name])
		if name == "bsm/redislock" {
			if y <= doc.all100+1 || !doc.dotted[name] {
				t.Errorf("%s left 2 waits unended, yet its curve ends at y %.1f (100%%: %.1f), dotted %v", name, y, doc.all100, doc.dotted[name])
			}
			continue
		}
		if math.Abs(y-doc.all100) > 0.05 || doc.dotted[name] {
			t.Errorf("%s: every wait ended, yet its curve ends at y %.1f (100%%: %.1f), dotted %v", name, y, doc.all100, doc.dotted[name])
		}
	}
	if !doc.hasText("2 of 2,002 waits never ended") || !doc.hasText("12 of 64 goroutines never served") || !doc.hasText("the curve ends at 99.9%") {
		t.Errorf("the legend does not say what bsm/redislock left unserved: %q", doc.texts)
	}
	if !doc.hasText("every wait ended, every goroutine served") || !doc.hasText("go -C bench run . (test)") {
		t.Errorf("the legend or the caption is missing: %q", doc.texts)
	}
}

// TestHTTPSVG_ABarPerModeAndShape: the HTTP figure is well-formed SVG with a
// bar per mode in each panel (one SKU, 1,024 SKUs), the axis labelled, and
// the ratio to none beside every bar but none's.
func TestHTTPSVG_ABarPerModeAndShape(t *testing.T) {
	var b bytes.Buffer
	if err := httpSVG(&b, httpBars(figureResults()), 64, "caption"); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	var want []string
	for _, sh := range httpShapes {
		for _, row := range httpRows {
			want = append(want, sh.title+": "+row.name)
		}
	}
	if !slices.Equal(doc.groups["bar"], want) {
		t.Errorf("bars %q, want %q", doc.groups["bar"], want)
	}
	for _, label := range []string{"requests per second", "one SKU", "1,024 SKUs", "3,050/s", "0.90× none", "0.60× none"} {
		if !doc.hasText(label) {
			t.Errorf("no text %q in %q", label, doc.texts)
		}
	}
}

// TestWriteFigures_OnlyWhatTheRunMeasured: the figures of the scenarios
// run are written into the directory, no other; a directory that is not
// there is refused before a run starts.
func TestWriteFigures_OnlyWhatTheRunMeasured(t *testing.T) {
	dir := t.TempDir()
	cfg := config{rounds: 3, httpClients: 64, scenarios: map[string]bool{"hot": true}}
	m := machine{command: "go -C bench run . -scenarios hot", revision: "commit abc1234", date: "2026-12-01", cpus: 2, model: "a CPU"}
	written, err := writeFigures(dir, cfg, m, figureResults())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(written, []string{filepath.Join(dir, hotKeyFigure)}) {
		t.Errorf("wrote %q, want the hot-key figure only", written)
	}
	data, err := os.ReadFile(filepath.Join(dir, hotKeyFigure))
	if err != nil {
		t.Fatal(err)
	}
	if !parseSVG(t, data).hasText("go -C bench run . -scenarios hot (seckillguard at commit abc1234), 2026-12-01, 3 rounds") {
		t.Errorf("the caption does not name the run:\n%s", data)
	}
	cfg.scenarios["http"] = true
	if written, err = writeFigures(dir, cfg, m, figureResults()); err != nil || len(written) != 2 {
		t.Errorf("with the HTTP rows: wrote %q, %v", written, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("the directory holds %d files, want the 2 figures (no temporary left)", len(entries))
	}
	if err := checkFigureDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("checkFigureDir accepted a directory that is not there")
	}
}

// TestKeepWaits_SplitsTheCutOnesOff: a run's waits less those cut short are
// the ones that ended; both add up over rounds.
func TestKeepWaits_SplitsTheCutOnesOff(t *testing.T) {
	r := newResults()
	r.keepWaits("x", []time.Duration{1, 2, 3, 3, 5}, []time.Duration{3, 5})
	r.keepWaits("x", []time.Duration{4}, nil)
	if s := r.waits["x"]; !slices.Equal(s.ended, []time.Duration{1, 2, 3, 4}) || !slices.Equal(s.cut, []time.Duration{3, 5}) {
		t.Errorf("ended %v, cut %v", s.ended, s.cut)
	}
}
