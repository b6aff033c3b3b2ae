// Package docs holds the project's documentation; its tests check what the
// documentation promises about the repository itself.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoModule is the library's module path; every module of the repository
// starts with it.
const repoModule = "github.com/seckillguard/seckillguard"

// goGet matches a command the documentation tells a user to run to fetch a
// package of this repository.
var goGet = regexp.MustCompile(`go (?:get|install) (` + regexp.QuoteMeta(repoModule) + `[^\s@` + "`" + `]*)`)

// TestModules_EveryGoGetTargetResolvesOutsideTheRepository: every package a
// user is told to `go get` or `go install` (README.md, docs/*.md) lies in a
// module whose go.mod a consumer can resolve: no replace directive (a
// consumer's build ignores it) and, for a module of this repository it
// requires, a released version whose tags CHANGELOG.md names, never the zero
// pseudo-version a replace stood in for. Such a module is in go.work, so that
// in the repository it is built against the tree, not the release.
func TestModules_EveryGoGetTargetResolvesOutsideTheRepository(t *testing.T) {
	root := ".."
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	changelog := read(t, filepath.Join(root, "CHANGELOG.md"))
	work := read(t, filepath.Join(root, "go.work"))
	modules := map[string]bool{} // module directories, relative to root
	for _, doc := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		for _, m := range goGet.FindAllStringSubmatch(read(t, doc), -1) {
			dir := moduleDir(t, root, strings.TrimPrefix(strings.TrimPrefix(m[1], repoModule), "/"))
			modules[dir] = true
		}
	}
	if !modules["."] {
		t.Errorf("no document says to go get the library (%s); the test reads the wrong files?", repoModule)
	}
	for dir := range modules {
		mod := read(t, filepath.Join(root, dir, "go.mod"))
		for _, d := range directives(mod) {
			switch {
			case d[0] == "replace":
				t.Errorf("%s/go.mod: replace %s: a consumer's build ignores it", dir, strings.Join(d[1:], " "))
			case d[0] == "require" && len(d) >= 3 && strings.HasPrefix(d[1], repoModule):
				path, version := d[1], d[2]
				if strings.HasPrefix(version, "v0.0.0-") {
					t.Errorf("%s/go.mod requires %s at the pseudo-version %s, which no consumer can resolve", dir, path, version)
					continue
				}
				// The release tags the required module and this one
				// together: "v0.1.0" and "sgotel/v0.1.0".
				for _, tag := range []string{tagOf(path, version), tagOf(repoModule+"/"+dir, version)} {
					if !strings.Contains(changelog, "`"+tag+"`") {
						t.Errorf("%s/go.mod requires %s %s, but CHANGELOG.md names no release tag `%s`", dir, path, version, tag)
					}
				}
			}
		}
		if dir != "." && !regexp.MustCompile(`(?m)^\s*\./`+regexp.QuoteMeta(dir)+`\s*$`).MatchString(work) {
			t.Errorf("go.work does not use ./%s: in the repository it would build against the release, not the tree", dir)
		}
	}
}

// tagOf is the git tag of module path at version: the version prefixed with
// the module's directory in the repository.
func tagOf(path, version string) string {
	if dir := strings.TrimPrefix(strings.TrimPrefix(path, repoModule), "/"); dir != "" && dir != "." {
		return dir + "/" + version
	}
	return version
}

// moduleDir returns the directory (relative to root, "." for the root) of
// the module holding the package dir.
func moduleDir(t *testing.T, root, dir string) string {
	t.Helper()
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(root, d, "go.mod")); err == nil {
			return filepath.ToSlash(d)
		}
		if d == "." || d == "/" {
			t.Fatalf("no go.mod holds %s", dir)
		}
	}
}

// directives returns the directives of a go.mod, one per line, each split
// into fields, with the block form ("require (...)") unfolded and comments
// dropped.
func directives(mod string) [][]string {
	var out [][]string
	block := ""
	for _, line := range strings.Split(mod, "\n") {
		line, _, _ = strings.Cut(line, "//")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case block != "" && f[0] == ")":
			block = ""
		case block != "":
			out = append(out, append([]string{block}, f...))
		case len(f) == 2 && f[1] == "(":
			block = f[0]
		default:
			out = append(out, f)
		}
	}
	return out
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
