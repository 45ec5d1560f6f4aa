package leakybucket

import (
	"context"
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
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestDocsNameWhatExists: no comment of the code, no page under docs/ and
// no README names an identifier that does not exist. A doc that cites a
// function renamed or gone sends its reader looking for nothing. Checked,
// in every module of the repository:
//
//   - in comments, a word in camelCase (incarnationField, ExtendTo) and
//     "see x" must name an identifier of the code, and pkg.Name, where pkg
//     is one of the repository's packages, a name that package declares;
//   - the doc of an exported declaration of a public package cites no
//     internal package (its reader cannot see it);
//   - in the Markdown pages, a name in backticks in camelCase or with a
//     dot (`ErrUnavailable`, `clock.LagLimit`) must name an identifier of
//     the code, or one of the outside names listed in docOutsideNames.
//
// CHANGELOG.md and docs/apidiff are history: they name what was removed.
func TestDocsNameWhatExists(t *testing.T) {
	code := readCode(t, ".")
	var bad []string
	for _, c := range code.comments {
		bad = append(bad, code.checkComment(c)...)
	}
	pages, _ := filepath.Glob("docs/*.md")
	for _, page := range append(pages, "README.md", "httplimit/README.md", "inflight/README.md") {
		text, err := os.ReadFile(page)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, code.checkPage(page, string(text))...)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// docOutsideNames are names from outside the repository that the pages
// cite: go-redis, miniredis, gRPC, the standard library, HTTP fields. A
// new one goes here.
var docOutsideNames = []string{
	"ClusterClient", "ClusterOptions", "ClusterStateReloadInterval", "DisableIdentity",
	"MaintNotificationsConfig", "MasterForKey", "ModeDisabled", "NoRetry", "PoolSize",
	"RawCmd", "StatusCmd", "RingOptions", "SetLogger", "ClockTTL", "Dial", "Dialer", "RetryStrategy",
	"OnLimit", "KeyFunc", "ResourceExhausted", "RetryInfo", "RemoteAddr", "ServeMux",
	"DeadlineExceeded", "Background", "Is", "Pattern", "Error", "Options", "RateLimit",
	"OpenTelemetry", "NaN", "DialerRetries", "MaxRetries", "gRPC", "kB",
	"CancelAt", "ResponseController",
	// Other projects' names, in the bench's descriptions of them.
	"RedissonPermitExpirableSemaphore", "trySetPermits", "RedisRateLimiter",
	// A placeholder in an example's comment.
	"meterProvider",
}

// docWords are the words that follow "see" in prose, not names.
var docWords = []string{"the", "that", "it", "below", "above", "docs", "package", "when", "how", "what", "why", "its", "their", "also", "each", "there", "here", "them", "a", "an"}

var (
	camelWord = regexp.MustCompile(`\b([a-z][a-z0-9]*[A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*)\b`)
	qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)\b`)
	seeWord   = regexp.MustCompile(`\bsee ([a-z][A-Za-z0-9_.]*[A-Za-z0-9_])`)
	backtick  = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\\(\\))?`")
	// Metric and attribute names (leakybucket.requests), file names
	// (breaker.go) and hosts are dotted, not qualified identifiers.
	notQualified = regexp.MustCompile(`^(leakybucket|error|google|codes|go|m|r|v[A-Z0-9]+)\.|\.(go|md|mod|sum|work|sh|txt|png|json|example|com|org)$`)
)

// docComment is one comment group of the code.
type docComment struct {
	at       string // file:line
	text     string
	exported bool // the doc of an exported declaration of a public package
}

// codeNames is what the repository's code declares and says.
type codeNames struct {
	idents   map[string]bool            // every identifier of the code, tests included
	packages map[string]map[string]bool // by package name: what it declares
	internal map[string]bool            // the names of internal packages
	comments []docComment               // of the non-test files
}

func readCode(t *testing.T, root string) codeNames {
	t.Helper()
	c := codeNames{idents: map[string]bool{}, packages: map[string]map[string]bool{}, internal: map[string]bool{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		return c.read(path)
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// read adds one file.
func (c *codeNames) read(path string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return err
	}
	name := f.Name.Name
	if c.packages[name] == nil {
		c.packages[name] = map[string]bool{}
	}
	if strings.Contains(filepath.ToSlash(path), "internal/") {
		c.internal[name] = true
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			c.idents[id.Name] = true
		}
		return true
	})
	for _, decl := range f.Decls {
		for _, n := range declared(decl) {
			c.packages[name][n] = true
		}
	}
	if strings.HasSuffix(path, "_test.go") {
		return nil
	}
	public := !c.internal[name] && name != "main"
	exported := map[*ast.CommentGroup]bool{}
	for _, decl := range f.Decls {
		if doc, ok := exportedDoc(decl); ok && public {
			exported[doc] = true
		}
	}
	for _, g := range f.Comments {
		c.comments = append(c.comments, docComment{at: fset.Position(g.Pos()).String(), text: g.Text(), exported: exported[g]})
	}
	return nil
}

// declared returns the names a top-level declaration declares.
func declared(decl ast.Decl) []string {
	var out []string
	switch d := decl.(type) {
	case *ast.FuncDecl:
		out = append(out, d.Name.Name)
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				out = append(out, s.Name.Name)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					out = append(out, n.Name)
				}
			}
		}
	}
	return out
}

// exportedDoc returns the doc of decl if it declares an exported name.
func exportedDoc(decl ast.Decl) (*ast.CommentGroup, bool) {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		return d.Doc, d.Doc != nil && d.Name.IsExported()
	case *ast.GenDecl:
		for _, n := range declared(d) {
			if ast.IsExported(n) {
				return d.Doc, d.Doc != nil
			}
		}
	}
	return nil, false
}

// checkComment returns what c names that does not exist.
func (code codeNames) checkComment(c docComment) []string {
	var bad []string
	for _, w := range camelWord.FindAllString(c.text, -1) {
		if !code.known(w) {
			bad = append(bad, c.at+": names "+w+", which the code does not declare")
		}
	}
	for _, m := range seeWord.FindAllStringSubmatch(c.text, -1) {
		if strings.Contains(m[1], ".") {
			continue // a file, or pkg.Name, checked below
		}
		if !code.known(m[1]) && !slices.Contains(docWords, m[1]) {
			bad = append(bad, c.at+": says \"see "+m[1]+"\", which the code does not declare")
		}
	}
	for _, m := range qualified.FindAllStringSubmatch(c.text, -1) {
		if notQualified.MatchString(m[0]) {
			continue
		}
		if names, ok := code.packages[m[1]]; ok && !names[m[2]] {
			bad = append(bad, c.at+": names "+m[0]+", which package "+m[1]+" does not declare")
		}
		if c.exported && code.internal[m[1]] {
			bad = append(bad, c.at+": the doc of an exported name cites "+m[0]+", in an internal package its reader cannot see")
		}
	}
	return bad
}

// checkPage returns what a Markdown page names in backticks that does not
// exist.
func (code codeNames) checkPage(page, text string) []string {
	var bad []string
	for i, line := range strings.Split(text, "\n") {
		for _, m := range backtick.FindAllStringSubmatch(line, -1) {
			name := m[1]
			if notQualified.MatchString(name) || !strings.Contains(name, ".") && !camelWord.MatchString(name) {
				continue // a command, a flag, a word
			}
			parts := strings.Split(name, ".")
			if last := parts[len(parts)-1]; !code.known(last) {
				bad = append(bad, page+":"+itoa(i+1)+": names `"+name+"`, which the code does not declare")
			}
		}
	}
	return bad
}

// known reports whether name is an identifier of the code, or an outside
// name the docs may cite.
func (code codeNames) known(name string) bool {
	return code.idents[name] || slices.Contains(docOutsideNames, name)
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

// TestEveryPackageHasADoc: go doc shows a package doc for every package of
// the repository, internal ones included: a doc comment attached to the
// package clause of one of its files. One detached by a blank line is no
// doc at all, and go doc shows nothing.
func TestEveryPackageHasADoc(t *testing.T) {
	documented := map[string]bool{} // by directory
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		documented[dir] = documented[dir] || f.Doc != nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, ok := range documented {
		if !ok {
			t.Errorf("%s: no package doc (go doc ./%s shows none)", dir, dir)
		}
	}
}

// The SCAN pattern docs/strategies.md shows for Logs is the one a Bucket
// writes under: a Bucket whose longest window is 10 s, at resource
// "GET /x", makes its logs under that prefix (issue #55: the page once
// showed a pattern without the layout's tag, which matched no key).
func TestDocsLogsScanPattern(t *testing.T) {
	const prefix = "leakybucket:w10000:{R0VUIC94}:log:"
	doc, err := os.ReadFile("docs/strategies.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`"+prefix+"*`") {
		t.Errorf("docs/strategies.md does not show the SCAN pattern %s*", prefix)
	}
	synctest.Test(t, func(t *testing.T) {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		rdb := miniClient(m)
		defer rdb.Close()
		b, err := New(rdb, PerClient(Per(5, 10*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Allow(context.Background(), "GET /x", "c"); err != nil {
			t.Fatal(err)
		}
		if logs := m.Keys(); len(logs) != 1 || !strings.HasPrefix(logs[0], prefix) {
			t.Errorf("a Logs Bucket wrote %v, want one key under %s", logs, prefix)
		}
	})
}
