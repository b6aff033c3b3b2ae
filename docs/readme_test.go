package docs

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The README is a front page: a team reads it in ten minutes.
const (
	readmeMaxLines = 250
	proseMaxCols   = 100
)

// TestREADME_IsAFrontPage: README.md has at most 250 lines, and no line of
// prose (outside code blocks and tables) is wider than 100 columns.
func TestREADME_IsAFrontPage(t *testing.T) {
	text := read(t, filepath.Join("..", "README.md"))
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) > readmeMaxLines {
		t.Errorf("README.md has %d lines, over %d: move the details to docs/", len(lines), readmeMaxLines)
	}
	for _, l := range prose(lines) {
		if n := utf8.RuneCountInString(l.text); n > proseMaxCols {
			t.Errorf("README.md:%d: %d columns, over %d: %s", l.n, n, proseMaxCols, l.text)
		}
	}
}

type numbered struct {
	n    int
	text string
}

// prose returns the lines outside fenced code blocks that are not table rows.
func prose(lines []string) []numbered {
	var out []numbered
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if fenced || strings.HasPrefix(l, "|") {
			continue
		}
		out = append(out, numbered{i + 1, l})
	}
	return out
}

// TestREADME_PackageTableListsEveryTopLevelFolder: the README's table under
// "## Packages" names every top-level folder of the repository, and only
// folders that exist.
func TestREADME_PackageTableListsEveryTopLevelFolder(t *testing.T) {
	text := read(t, filepath.Join("..", "README.md"))
	_, table, ok := strings.Cut(text, "\n## Packages\n")
	if !ok {
		t.Fatal(`README.md has no "## Packages" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	link := regexp.MustCompile("\\[`([^`]+)`\\]\\(([^)]+)\\)")
	listed := map[string]bool{}
	for _, row := range strings.Split(table, "\n") {
		if !strings.HasPrefix(row, "| [") {
			continue
		}
		first := strings.Split(row, "|")[1]
		for _, m := range link.FindAllStringSubmatch(first, -1) {
			if m[1] != m[2] {
				t.Errorf("package table: [`%s`] links to %s", m[1], m[2])
			}
			if _, err := os.Stat(filepath.Join("..", m[2])); err != nil {
				t.Errorf("package table lists %s, which does not exist", m[2])
			}
			listed[strings.Split(m[2], "/")[0]] = true
		}
	}
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !listed[e.Name()] {
			t.Errorf("README.md's package table does not list the folder %s/", e.Name())
		}
	}
}

// goBlock is a fenced ```go block of a document.
type goBlock struct {
	doc  string
	line int
	code string
}

// goBlocks returns the ```go blocks of the document at path.
func goBlocks(t *testing.T, path string) []goBlock {
	t.Helper()
	var out []goBlock
	var cur *goBlock
	var body []string
	for i, l := range strings.Split(read(t, path), "\n") {
		switch {
		case cur == nil && l == "```go":
			cur, body = &goBlock{doc: filepath.Base(path), line: i + 1}, nil
		case cur != nil && l == "```":
			cur.code = strings.Join(body, "\n")
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body = append(body, l)
		}
	}
	return out
}

// compiledSnippets returns, from every _test.go file of the repository, the
// bodies of its Example functions (with and without their Output comment)
// and the regions between "// guide:begin NAME" and "// guide:end NAME",
// each dedented, mapped to where it comes from.
func compiledSnippets(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") || fn.Body == nil {
				continue
			}
			body := string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
			where := fmt.Sprintf("%s: %s", path, fn.Name.Name)
			out[normalize(body)] = where
			if i := strings.Index(body, "\n\t// Output:"); i >= 0 {
				out[normalize(body[:i])] = where + " (without its Output)"
			}
		}
		for name, region := range regions(string(src)) {
			out[normalize(region)] = fmt.Sprintf("%s: region %s", path, name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var regionMark = regexp.MustCompile(`^\s*// guide:(begin|end) (\w+)$`)

// regions returns the text between "// guide:begin NAME" and
// "// guide:end NAME" lines of src, by name.
func regions(src string) map[string]string {
	out := map[string]string{}
	name := ""
	var lines []string
	for _, l := range strings.Split(src, "\n") {
		m := regionMark.FindStringSubmatch(l)
		switch {
		case m != nil && m[1] == "begin":
			name, lines = m[2], nil
		case m != nil && m[1] == "end" && m[2] == name:
			out[name] = strings.Join(lines, "\n")
			name = ""
		case name != "":
			lines = append(lines, l)
		}
	}
	return out
}

// normalize dedents code by its common leading tabs and trims blank lines
// at either end.
func normalize(code string) string {
	lines := strings.Split(code, "\n")
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
		lines[i] = strings.TrimRightFunc(lines[i], unicode.IsSpace)
	}
	return strings.Join(lines, "\n")
}

// TestDocs_GoCodeIsCompiledCode: every ```go block of README.md and
// docs/GUIDE.md is, word for word, the body of an Example function (which
// go test compiles, and runs when it has an Output comment) or a region of
// a test file marked "// guide:begin NAME" ... "// guide:end NAME" (the
// guide's code, run by TestGuide_* in guard/). A snippet that drifts from
// the code it shows fails here.
func TestDocs_GoCodeIsCompiledCode(t *testing.T) {
	compiled := compiledSnippets(t)
	for _, doc := range []string{filepath.Join("..", "README.md"), "GUIDE.md"} {
		blocks := goBlocks(t, doc)
		if len(blocks) == 0 {
			t.Errorf("%s has no ```go block: the test reads the wrong file?", doc)
		}
		for _, b := range blocks {
			if _, ok := compiled[normalize(b.code)]; !ok {
				t.Errorf("%s:%d: this go block is neither an Example's body nor a guide region of a test file; "+
					"copy it from the code it shows:\n%s", b.doc, b.line, b.code)
			}
		}
	}
}

// TestDocs_GuideQuotesEveryRegionOfItsCode: each guide region of
// guard/example_guide_test.go is quoted in docs/GUIDE.md, so that no part
// of the code the guide runs is missing from the page.
func TestDocs_GuideQuotesEveryRegionOfItsCode(t *testing.T) {
	quoted := map[string]bool{}
	for _, b := range goBlocks(t, "GUIDE.md") {
		quoted[normalize(b.code)] = true
	}
	rs := regions(read(t, filepath.Join("..", "guard", "example_guide_test.go")))
	if len(rs) == 0 {
		t.Fatal("guard/example_guide_test.go has no guide regions")
	}
	for name, r := range rs {
		if !quoted[normalize(r)] {
			t.Errorf("docs/GUIDE.md does not quote the region %q of guard/example_guide_test.go as it stands", name)
		}
	}
}

// markdownLink matches a link or an image: its target.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocs_RelativeLinksResolve: every relative link of README.md,
// example-seckill/README.md and docs/*.md names a file that exists, and
// an anchor a heading of that file.
func TestDocs_RelativeLinksResolve(t *testing.T) {
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join("..", "README.md"), filepath.Join("..", "example-seckill", "README.md"))
	for _, doc := range docs {
		for _, l := range prose(strings.Split(read(t, doc), "\n")) {
			checkLinks(t, doc, l)
		}
		// Table rows hold links too.
		for i, row := range strings.Split(read(t, doc), "\n") {
			if strings.HasPrefix(row, "|") {
				checkLinks(t, doc, numbered{i + 1, row})
			}
		}
	}
}

func checkLinks(t *testing.T, doc string, l numbered) {
	t.Helper()
	for _, m := range markdownLink.FindAllStringSubmatch(l.text, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		path := doc
		if file != "" {
			path = filepath.Join(filepath.Dir(doc), file)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s:%d: link to %s: no such file", doc, l.n, target)
			continue
		}
		if anchor != "" && !slices.Contains(anchors(t, path), anchor) {
			t.Errorf("%s:%d: link to %s: %s has no heading with that anchor", doc, l.n, target, path)
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a markdown file:
// lower case, spaces to hyphens, punctuation other than hyphens and
// underscores dropped.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	fenced := false
	sc := bufio.NewScanner(strings.NewReader(read(t, path)))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
