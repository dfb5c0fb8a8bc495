package rls_test

import (
	"os"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// The shortest use in the package doc compiles.
func TestPackageDocSnippet(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	code, err := docsnippet.ShortestUse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	docsnippet.Check(t, ".", docsnippet.Snippet{Name: "rls/doc.go", Code: code,
		Given: "import \"google.golang.org/grpc\"\nvar yaml []byte\nvar store ratelimit.Store\nvar grpcServer *grpc.Server"})
}
