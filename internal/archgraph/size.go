package archgraph

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Size limits of issue 23 for production code (tests and generated code
// aside): a file a reader can hold, a function a reader can follow.
const (
	MaxFileLines = 900
	MaxFuncLines = 120
)

// Oversized lists, for the Go source src of the file named name, what
// breaks the size limits: "name: N lines" and "name: func F is N lines".
// Test files and generated files ("Code generated ... DO NOT EDIT.") are
// exempt. A file that does not parse is reported as such.
func Oversized(name string, src []byte) []string {
	if strings.HasSuffix(name, "_test.go") || isGenerated(src) {
		return nil
	}
	var out []string
	if n := bytes.Count(src, []byte("\n")); n > MaxFileLines {
		out = append(out, fmt.Sprintf("%s: %d lines (at most %d: split it by what its parts do)", name, n, MaxFileLines))
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return append(out, fmt.Sprintf("%s: does not parse: %v", name, err))
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > MaxFuncLines {
			out = append(out, fmt.Sprintf("%s: func %s is %d lines (at most %d)", name, fd.Name.Name, n, MaxFuncLines))
		}
	}
	return out
}

func isGenerated(src []byte) bool {
	head := src
	if len(head) > 2048 {
		head = head[:2048]
	}
	return bytes.Contains(head, []byte("Code generated")) && bytes.Contains(head, []byte("DO NOT EDIT"))
}

// OversizedTree walks the module at root (skipping vendor, testdata and
// hidden directories) and returns every Oversized finding.
func OversizedTree(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "vendor" || n == "testdata" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, Oversized(rel, src)...)
		return nil
	})
	return out, err
}
