// Package lint holds repository-wide checks run as tests, in the manner of
// Pebble's internal/lint: rules the compiler cannot enforce.
package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// shippedGoFiles parses every shipped Go file under root (tests, generated
// .pb.go files, hidden directories, testdata and vendor aside) and calls fn
// with its path relative to root. skipDir, if set, prunes more directories
// (by their slash-separated path relative to root).
func shippedGoFiles(t *testing.T, root string, fset *token.FileSet, skipDir func(rel string) bool, fn func(rel string, f *ast.File)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if skipDir != nil && skipDir(filepath.ToSlash(rel)) {
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
		fn(rel, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// position is pos as rel:line:column.
func position(fset *token.FileSet, rel string, pos token.Pos) string {
	p := fset.Position(pos)
	return fmt.Sprintf("%s:%d:%d", rel, p.Line, p.Column)
}

// TestNoMatchingOnErrorText: no code outside tests decides anything by
// looking inside an error's text (strings.Contains(err.Error(), ...), a
// regular expression over status.Message()): errors are typed (the
// client's kinds, the node's status details), and text changes without
// notice. Tests may check messages; shipped code may not parse them.
func TestNoMatchingOnErrorText(t *testing.T) {
	fset := token.NewFileSet()
	var bad []string
	shippedGoFiles(t, repoRoot(t), fset, nil, func(rel string, f *ast.File) {
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
					bad = append(bad, position(fset, rel, call.Pos()))
				}
			}
			return true
		})
	})
	for _, b := range bad {
		t.Errorf("%s: matches on an error's text; use a typed error (errors.Is/As, client.AsError, status details)", b)
	}
}

// Import paths of the packages whose use marks code that speaks to a node
// by itself.
const (
	grpcPath    = "google.golang.org/grpc"
	dedupv1Path = "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// nodeSpeakers are the directories whose code may speak to a node itself:
// the client package (the only code that does so for the CLI and every
// tool, as etcd's clientv3), the server (its node-to-node calls: forwarded
// writes, read index) and the API package that defines the services.
var nodeSpeakers = []string{"client", "server", "api"}

// rawNodeCalls returns the positions in f where it builds a connection or
// a service stub of its own: grpc.NewClient, grpc.Dial, grpc.DialContext,
// or a dedupv1.New…Client constructor (called or taken as a value), under
// whatever names f imports the two packages.
func rawNodeCalls(f *ast.File) []token.Pos {
	names := map[string]string{} // local name -> import path
	for _, im := range f.Imports {
		path := strings.Trim(im.Path.Value, `"`)
		if path != grpcPath && path != dedupv1Path {
			continue
		}
		name := filepath.Base(path)
		if path == dedupv1Path {
			name = "dedupv1" // the package's own name (package dedupv1)
		}
		if im.Name != nil {
			name = im.Name.Name
		}
		if name != "_" && name != "." {
			names[name] = path
		}
	}
	var out []token.Pos
	if len(names) == 0 {
		return out
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok || id.Obj != nil { // id.Obj != nil: a local variable, not the package
			return true
		}
		fn := sel.Sel.Name
		switch names[id.Name] {
		case grpcPath:
			if fn == "NewClient" || fn == "Dial" || fn == "DialContext" {
				out = append(out, sel.Pos())
			}
		case dedupv1Path:
			if strings.HasPrefix(fn, "New") && strings.HasSuffix(fn, "Client") {
				out = append(out, sel.Pos())
			}
		}
		return true
	})
	return out
}

// TestOnlyClientSpeaksToNodes: outside client/, server/ and api/, no
// shipped code (tests and generated code aside) dials a node or builds a
// raw service stub: the CLI and every tool go through package client
// (issue 14), so that routing, retries, TLS, tokens and typed errors are
// the same everywhere. A tool that needs something the client lacks adds
// a small client API (as client.MarkAt for the bench).
func TestOnlyClientSpeaksToNodes(t *testing.T) {
	fset := token.NewFileSet()
	var bad []string
	speaker := func(rel string) bool { return slices.Contains(nodeSpeakers, rel) }
	shippedGoFiles(t, repoRoot(t), fset, speaker, func(rel string, f *ast.File) {
		for _, p := range rawNodeCalls(f) {
			bad = append(bad, position(fset, rel, p))
		}
	})
	for _, b := range bad {
		t.Errorf("%s: speaks to a node without package client (raw gRPC connection or dedupv1 stub); use client, adding a small API there if needed", b)
	}
}

// The checker finds raw connections and stubs under any import name, and
// leaves alone look-alikes that are not the two packages.
func TestRawNodeCallsFindsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want int
	}{
		{`package p
import "google.golang.org/grpc"
func f() { grpc.NewClient("x"); grpc.Dial("x"); grpc.DialContext(nil, "x") }`, 3},
		{`package p
import dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
func f() { dedupv1.NewDedupClient(nil); dedupv1.NewAdminClient(nil); _ = dedupv1.NewOpsClient }`, 3},
		{`package p
import pb "github.com/dedupnode/dedupnode/api/dedup/v1"
import g "google.golang.org/grpc"
func f() { pb.NewDedupClient(nil); g.NewClient("x") }`, 2},
		{`package p
import "github.com/dedupnode/dedupnode/api/dedup/v1"
func f() { dedupv1.NewDedupClient(nil) }`, 1},
		{`package p
import "github.com/dedupnode/dedupnode/client"
import "google.golang.org/grpc"
func f() { client.New(nil, nil); _ = grpc.WithBlock(); var grpc struct{ NewClient func() }; grpc.NewClient() }`, 0},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), "p.go", tc.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(rawNodeCalls(f)); got != tc.want {
			t.Errorf("found %d raw calls, want %d in:\n%s", got, tc.want, tc.src)
		}
	}
}
