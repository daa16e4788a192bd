// Package lint holds repository-wide checks run as tests, in the manner of
// Pebble's internal/lint: rules the compiler cannot enforce.
package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the module root: the nearest parent with a go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

// textMatchers are the functions that look inside a string.
var textMatchers = map[string]bool{
	// package strings
	"Contains": true, "ContainsAny": true, "HasPrefix": true, "HasSuffix": true, "Index": true,
	"LastIndex": true, "Cut": true, "CutPrefix": true, "CutSuffix": true, "EqualFold": true,
	"TrimPrefix": true, "TrimSuffix": true, "ReplaceAll": true, "Replace": true, "Split": true,
	"SplitN": true, "Count": true,
	// package regexp and *regexp.Regexp
	"MatchString": true, "FindString": true, "FindStringSubmatch": true, "FindAllString": true,
	"FindStringIndex": true, "FindAllStringSubmatch": true, "ReplaceAllString": true,
}

// errorText reports whether e is an error's or a gRPC status's text:
// x.Error(), x.Message(), or a conversion/format of one.
func errorText(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	if sel, ok := call.Fun.(*ast.SelectorExpr); ok && len(call.Args) == 0 {
		return sel.Sel.Name == "Error" || sel.Sel.Name == "Message"
	}
	return false
}

// TestNoMatchingOnErrorText: no code outside tests decides anything by
// looking inside an error's text (strings.Contains(err.Error(), ...), a
// regular expression over status.Message()): errors are typed (the
// client's kinds, the node's status details), and text changes without
// notice. Tests may check messages; shipped code may not parse them.
func TestNoMatchingOnErrorText(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !textMatchers[sel.Sel.Name] {
				return true
			}
			for _, a := range call.Args {
				if errorText(a) {
					rel, _ := filepath.Rel(root, path)
					bad = append(bad, rel+":"+strings.TrimPrefix(fset.Position(call.Pos()).String(), path+":"))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("%s: matches on an error's text; use a typed error (errors.Is/As, client.AsError, status details)", b)
	}
}
