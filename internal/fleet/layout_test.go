package fleet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The table of docs/internals.md lists exactly the keys this package
// names: a key added here without its row, or a row left behind, fails.
func TestDocsTableMatchesTheLayout(t *testing.T) {
	b, err := os.ReadFile("../../docs/internals.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(/hyperpodrun/[^`]*)` \\|")
	var documented []string
	for _, l := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			documented = append(documented, m[1])
		}
	}
	want := NewKeys("").Documented()
	for _, k := range want {
		if !slices.Contains(documented, k) {
			t.Errorf("docs/internals.md has no row for %s", k)
		}
	}
	for _, k := range documented {
		if !slices.Contains(want, k) {
			t.Errorf("docs/internals.md documents %s, which package fleet does not name", k)
		}
	}
}

// keyish matches a string that spells part of the etcd layout: the prefix,
// or one of the layout's segments next to a slash (a directory segment
// followed by one, a last segment preceded by one). The segments are
// derived from Keys.Documented(), so a new key is guarded as soon as it is
// documented.
var keyish = keyishFrom(NewKeys(""))

func keyishFrom(k Keys) *regexp.Regexp {
	dirs, leaves := map[string]bool{}, map[string]bool{}
	for _, key := range k.Documented() {
		segs := strings.Split(strings.TrimPrefix(key, k.Prefix()+"/"), "/")
		for i, seg := range segs {
			if seg == "" || strings.ContainsAny(seg, "<>.") {
				continue
			}
			if i < len(segs)-1 {
				dirs[seg] = true
			} else {
				leaves[seg] = true
			}
		}
	}
	alt := func(m map[string]bool) string {
		var out []string
		for s := range m {
			out = append(out, regexp.QuoteMeta(s))
		}
		sort.Strings(out)
		return strings.Join(out, "|")
	}
	return regexp.MustCompile(`^` + regexp.QuoteMeta(k.Prefix()) + `(/|$)|(^|/)(` + alt(dirs) + `)/|/(` + alt(leaves) + `)$`)
}

// No package but this one formats a key: every production Go file of the
// module is searched for string literals that spell part of the layout.
func TestNoOtherPackageFormatsAKey(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == self || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if _, ok := n.(*ast.ImportSpec); ok {
				return false
			}
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && keyish.MatchString(s) {
				rel, _ := filepath.Rel(root, fset.Position(lit.Pos()).Filename)
				t.Errorf("%s:%d: %q spells an etcd key: ask package fleet (Keys) for it", rel, fset.Position(lit.Pos()).Line, s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The test above catches what it is meant to catch.
func TestKeyishCatchesHandMadeKeys(t *testing.T) {
	for _, s := range []string{"/hyperpodrun", "/jobs/", "/restarts-counted", "/checkpoint", "specs/", "nodes/", "/ready/",
		"assign/", "problems/", "creds/", "/running/", "status/", "alive/", "reports/", "rdzv/", "coordinator/", "/usage", "/leader"} {
		if !keyish.MatchString(s) {
			t.Errorf("keyish misses %q", s)
		}
	}
	for _, s := range []string{"checkpoint", "/proc/%d/stat", "ready", "stopped", "status: ok", "bin/hyperpodrun", "github.com/hyperpodrun/hyperpodrun/agent/elastic"} {
		if keyish.MatchString(s) {
			t.Errorf("keyish flags %q", s)
		}
	}
}

func TestRoundsParseAsHex16WritesThem(t *testing.T) {
	k := NewKeys("").Rdzv("j")
	for _, tc := range []struct {
		rule string
		key  string
		want int64
		ok   bool
	}{
		{"failure key of round 0x2a", k.Failure(42), 42, true},
		{"largest round", k.Failure(1<<63 - 1), 1<<63 - 1, true},
		{"short segment", k.Failures + "2a", 0, false},
		{"not hex", k.Failures + "zzzzzzzzzzzzzzzz", 0, false},
		{"beyond int64", k.Failures + "8000000000000000", 0, false},
		{"another prefix", k.DoneKey(42), 0, false},
	} {
		got, ok := k.FailureRound(tc.key)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: FailureRound(%q) = %d, %v; want %d, %v", tc.rule, tc.key, got, ok, tc.want, tc.ok)
		}
	}
	if r, ok := k.DoneRound(k.DoneKey(7)); r != 7 || !ok {
		t.Errorf("DoneRound(DoneKey(7)) = %d, %v", r, ok)
	}
}
