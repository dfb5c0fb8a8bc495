package grpcx_test

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
	docsnippet.Check(t, ".", docsnippet.Snippet{Name: "grpcx/doc.go", Code: code,
		Given: "var chain spillway.Limiter\nvar addr string\nvar creds grpc.DialOption"})
}
