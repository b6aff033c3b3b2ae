package guard

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/seckillguard/seckillguard/ginmw"
)

var updateREADME = flag.Bool("update-readme", false, "write the table of the framework's answers into ../README.md")

const (
	answersBegin = "<!-- answers:begin -->"
	answersEnd   = "<!-- answers:end -->"
)

// The README's HTTP table is the table of answers.go: the text between its
// markers is answersTable(). go test ./guard -run TestAnswers_TheREADME
// -update-readme writes it.
func TestAnswers_TheREADMEsTableIsTheTable(t *testing.T) {
	const path = "../README.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i, j := strings.Index(s, answersBegin), strings.Index(s, answersEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s ... %s markers", answersBegin, answersEnd)
	}
	want := answersBegin + "\n" + answersTable() + answersEnd
	if s[i:j+len(answersEnd)] == want {
		return
	}
	if *updateREADME {
		if err := os.WriteFile(path, []byte(s[:i]+want+s[j+len(answersEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's table of answers differs from answers.go; run go test ./guard -run TestAnswers_TheREADME -update-readme. Want:\n%s", want)
}

// The answers of ginmw's errors are written by ginmw.AbortError: their
// status and code are the table's.
func TestAnswers_GinmwErrorsAnswerAsTheTableSays(t *testing.T) {
	for _, err := range []error{ginmw.ErrMissingField, ginmw.ErrUnsafeValue, ginmw.ErrBadBody, ginmw.ErrBodyTooLarge, ginmw.ErrValueType, errors.New("other")} {
		a := errorAnswer(fmt.Errorf("wrapped: %w", err))
		if ginmw.Status(err) != a.status || ginmw.Code(err) != a.code {
			t.Errorf("%v: ginmw answers %d %s, the table %d %s", err, ginmw.Status(err), ginmw.Code(err), a.status, a.code)
		}
	}
	codes := map[string]bool{}
	for _, a := range answers {
		if a.code != "" && codes[a.code] {
			t.Errorf("code %q twice in the table", a.code)
		}
		codes[a.code] = true
	}
}

// Every answer the framework writes comes from the table: outside
// answers.go, the package writes none with ginmw.Abort or gin's
// AbortWithStatus (a replay writes the stored answer, the handler's).
func TestAnswers_NothingElseWritesAnAnswer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	writes := regexp.MustCompile(`ginmw\.Abort(Error)?\(|\bc\.(AbortWithStatus(JSON)?|JSON|String|Data)\(`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "answers.go" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			if trimmed := strings.TrimSpace(line); !strings.HasPrefix(trimmed, "//") && writes.MatchString(line) {
				t.Errorf("%s:%d writes an answer outside the table: %s", f, n+1, trimmed)
			}
		}
	}
}
