//go:build ignore

// Command mutants checks that the tests which claim to guard each protecting
// mechanism fail without it. Run it as `bash scripts/mutants`; see that
// file for the flags.
//
// Each file in scripts/testdata/mutants/*.mutant names a mechanism, a
// mutation that takes it away (exact snippets of the source replaced by
// others) and the tests that claim to guard it. For each mutant the command
// applies the mutation to a temporary copy of the tree, runs those tests and
// records which failed. A mutant is killed when at least one of its tests
// fails; it survives when all pass. A mutation whose snippet is no longer
// found exactly once, or that does not build, is a failure too: the
// mutation has to be kept current with the code, never skipped. The tests
// are first run on the unmutated copy, which must pass.
//
// The file format:
//
//	mechanism: the fence clause (gormplugin)
//	mutation: "fence <= token" is always true
//	quick: yes                 (optional: part of the -quick subset)
//	race: yes                  (optional: its tests run with -race, for a
//	                            mechanism that orders memory accesses)
//	test: ./gormplugin/ TestA TestB
//	test: ./reliability/ TestC
//	file: gormplugin/clauses.go
//	<<<<
//	the exact snippet, as many lines as needed
//	====
//	its replacement
//	>>>>
//
// Several file/<<<</====/>>>> blocks may follow one another.
//
// -quick runs the mutants marked quick against their first test line only:
// the cheap, package-level check; the full run adds the scenarios.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

type hunk struct {
	file     string
	old, new string
}

type testSet struct {
	pkg   string
	names []string
	race  bool // run with -race
}

func (s testSet) String() string {
	if s.race {
		return "-race " + s.pkg + " " + strings.Join(s.names, " ")
	}
	return s.pkg + " " + strings.Join(s.names, " ")
}

type mutant struct {
	name      string // the file name without .mutant
	mechanism string
	mutation  string
	quick     bool
	race      bool // its tests run with -race
	tests     []testSet
	hunks     []hunk
}

type result struct {
	m        *mutant
	killedBy []string
	failure  string // the mutant could not be checked
	took     time.Duration
}

func main() {
	quick := flag.Bool("quick", false, "run only the mutants marked quick (the CI subset)")
	run := flag.String("run", "", "run only the mutants whose file name matches this regexp")
	keep := flag.Bool("keep", false, "keep the temporary copy of the tree")
	flag.Parse()

	root, err := os.Getwd()
	check(err)
	files, err := filepath.Glob(filepath.Join(root, "scripts", "testdata", "mutants", "*.mutant"))
	check(err)
	sort.Strings(files)
	var re *regexp.Regexp
	if *run != "" {
		re = regexp.MustCompile(*run)
	}
	var mutants []*mutant
	for _, f := range files {
		m, err := parse(f)
		if err != nil {
			fatalf("%v", err)
		}
		if (*quick && !m.quick) || (re != nil && !re.MatchString(m.name)) {
			continue
		}
		if *quick {
			m.tests = m.tests[:1]
		}
		mutants = append(mutants, m)
	}
	if len(mutants) == 0 {
		fatalf("no mutant selected")
	}

	tmp, err := os.MkdirTemp("", "seckillguard-mutants-")
	check(err)
	if *keep {
		fmt.Fprintln(os.Stderr, "mutants: the copy is in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	tree := filepath.Join(tmp, "tree")
	check(copyTree(root, tree))

	// The unmutated tree must pass every test a mutant relies on.
	seen := make(map[string]bool)
	for _, m := range mutants {
		for _, ts := range m.tests {
			if seen[ts.String()] {
				continue
			}
			seen[ts.String()] = true
			fmt.Fprintf(os.Stderr, "mutants: baseline %s\n", ts)
			if failed, out, err := goTest(tree, ts); err != nil || len(failed) > 0 {
				fatalf("the unmutated tree fails %s (%v, failed %v):\n%s", ts, err, failed, tail(out))
			}
		}
	}

	var results []result
	for _, m := range mutants {
		fmt.Fprintf(os.Stderr, "mutants: %s\n", m.name)
		results = append(results, try(tree, m))
	}

	bad := 0
	fmt.Println("| mechanism | mutation | tests run | killed by |")
	fmt.Println("| --- | --- | --- | --- |")
	for _, r := range results {
		var tests []string
		for _, ts := range r.m.tests {
			for _, n := range ts.names {
				tests = append(tests, "`"+n+"`")
			}
		}
		killed := strings.Join(quote(r.killedBy), ", ")
		switch {
		case r.failure != "":
			killed = "**FAILURE: " + r.failure + "**"
			bad++
		case len(r.killedBy) == 0:
			killed = "**SURVIVED**"
			bad++
		}
		fmt.Printf("| %s | %s (`%s`) | %s | %s |\n", r.m.mechanism, r.m.mutation, r.m.name, strings.Join(tests, ", "), killed)
	}
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "mutants: %d of %d mutants not killed\n", bad, len(results))
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "mutants: all %d killed\n", len(results))
}

// try applies m to tree, runs its tests and restores the files.
func try(tree string, m *mutant) (r result) {
	start := time.Now()
	r.m = m
	defer func() { r.took = time.Since(start) }()
	originals := make(map[string][]byte)
	defer func() {
		for f, data := range originals {
			check(os.WriteFile(filepath.Join(tree, f), data, 0o644))
		}
	}()
	for _, h := range m.hunks {
		path := filepath.Join(tree, h.file)
		data, err := os.ReadFile(path)
		if err != nil {
			r.failure = fmt.Sprintf("%s: %v", h.file, err)
			return r
		}
		if _, ok := originals[h.file]; !ok {
			originals[h.file] = data
		}
		if n := bytes.Count(data, []byte(h.old)); n != 1 {
			r.failure = fmt.Sprintf("the snippet of %s is found %d times, not once: the mutation no longer applies", h.file, n)
			return r
		}
		check(os.WriteFile(path, bytes.Replace(data, []byte(h.old), []byte(h.new), 1), 0o644))
	}
	for _, ts := range m.tests {
		failed, out, err := goTest(tree, ts)
		if err != nil && len(failed) == 0 {
			r.failure = fmt.Sprintf("%s did not run: %s", ts, firstLine(out))
			return r
		}
		r.killedBy = append(r.killedBy, failed...)
	}
	return r
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// goTest runs the tests of ts in tree and returns the names of those that
// failed (top-level tests only). err is set when go test failed; with no
// failed test named, the package did not build or the run broke.
func goTest(tree string, ts testSet) (failed []string, out []byte, err error) {
	pattern := "^(" + strings.Join(ts.names, "|") + ")$"
	args := []string{"test", "-trimpath", "-count=1", "-timeout", "5m"}
	if ts.race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "-run", pattern, ts.pkg)...)
	cmd.Dir = tree
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	out, err = cmd.CombinedOutput()
	seen := make(map[string]bool)
	for _, m := range failLine.FindAllSubmatch(out, -1) {
		name := string(m[1])
		if i := strings.IndexByte(name, '/'); i >= 0 {
			name = name[:i]
		}
		if !seen[name] {
			seen[name] = true
			failed = append(failed, name)
		}
	}
	if err == nil && !bytes.Contains(out, []byte("ok")) {
		err = fmt.Errorf("no test ran")
	}
	if err == nil && bytes.Contains(out, []byte("no tests to run")) {
		err = fmt.Errorf("no test matched %s", pattern)
	}
	return failed, out, err
}

// parse reads one .mutant file.
func parse(path string) (*mutant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := &mutant{name: strings.TrimSuffix(filepath.Base(path), ".mutant")}
	errf := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", path, line, fmt.Sprintf(format, args...))
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var file string
	var block *strings.Builder
	var cur hunk
	state := "" // "", "old", "new"
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case state == "" && line == "<<<<":
			if file == "" {
				return nil, errf(n, "<<<< before any file:")
			}
			cur = hunk{file: file}
			block, state = &strings.Builder{}, "old"
		case state == "old" && line == "====":
			cur.old = block.String()
			block, state = &strings.Builder{}, "new"
		case state == "new" && line == ">>>>":
			cur.new = block.String()
			if cur.old == "" {
				return nil, errf(n, "empty snippet")
			}
			m.hunks = append(m.hunks, cur)
			state = ""
		case state != "":
			block.WriteString(line)
			block.WriteByte('\n')
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#"):
		default:
			k, v, ok := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			if !ok {
				return nil, errf(n, "want \"name: value\", got %q", line)
			}
			switch k {
			case "mechanism":
				m.mechanism = v
			case "mutation":
				m.mutation = v
			case "quick":
				m.quick = v == "yes"
			case "race":
				m.race = v == "yes"
			case "file":
				file = v
			case "test":
				fields := strings.Fields(v)
				if len(fields) < 2 {
					return nil, errf(n, "want \"test: ./pkg/ TestName...\"")
				}
				m.tests = append(m.tests, testSet{pkg: fields[0], names: fields[1:]})
			default:
				return nil, errf(n, "unknown field %q", k)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for i := range m.tests {
		m.tests[i].race = m.race
	}
	switch {
	case state != "":
		return nil, fmt.Errorf("%s: unterminated snippet", path)
	case m.mechanism == "" || m.mutation == "":
		return nil, fmt.Errorf("%s: mechanism and mutation are required", path)
	case len(m.tests) == 0:
		return nil, fmt.Errorf("%s: no test", path)
	case len(m.hunks) == 0:
		return nil, fmt.Errorf("%s: no snippet to replace", path)
	}
	return m, nil
}

// copyTree copies the files git knows of (tracked, and untracked but not
// ignored) from root to dst.
func copyTree(root, dst string) error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := copyFile(src, to, info.Mode()); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func quote(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "`" + n + "`"
	}
	return out
}

func firstLine(out []byte) string {
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return "no output"
}

func tail(out []byte) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

func check(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mutants: "+format+"\n", args...)
	os.Exit(2)
}
