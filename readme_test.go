package leakybucket

import (
	"os"
	"strings"
	"testing"
)

// The README's quick start is the body of ExampleNew, which `go test` runs
// and checks: the two cannot drift apart.
func TestReadmeQuickStartIsExampleNew(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func ExampleNew() {\n")
	if !ok {
		t.Fatal("example_test.go has no ExampleNew")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "func main() {\n"+body+"\n}\n") {
		t.Errorf("README.md's quick start is not the body of ExampleNew:\n%s", body)
	}
}
