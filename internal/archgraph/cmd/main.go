// Command archgraph rewrites ARCHITECTURE.md's package picture from `go
// list` (make architecture), and exits 1 naming each import that goes up a
// layer.
package main

import (
	"fmt"
	"os"

	"github.com/hyperpodrun/hyperpodrun/internal/archgraph"
)

func main() {
	g, err := archgraph.Load(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "archgraph:", err)
		os.Exit(1)
	}
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		fmt.Fprintln(os.Stderr, "archgraph: run it at the repository's root:", err)
		os.Exit(1)
	}
	out, err := archgraph.Splice(string(doc), archgraph.Mermaid(g))
	if err != nil {
		fmt.Fprintln(os.Stderr, "archgraph: ARCHITECTURE.md:", err)
		os.Exit(1)
	}
	if err := os.WriteFile("ARCHITECTURE.md", []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "archgraph:", err)
		os.Exit(1)
	}
	if bad := archgraph.Check(g); len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(os.Stderr, "archgraph:", b)
		}
		os.Exit(1)
	}
}
