// Command gen writes the ElasticJob controller's Kubernetes manifests
// (CRDs, RBAC, Deployment; package manifests) into examples/kubernetes/.
// Run it from the repository root: go run ./operator-shim/kubernetes/gen
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

func main() {
	dir := flag.String("dir", "examples/kubernetes", "where to write the manifests")
	flag.Parse()
	files, err := manifests.Files()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(*dir, n)
		if err := os.WriteFile(p, files[n], 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "gen: %v (run it from the repository root, or pass -dir)\n", err)
			os.Exit(1)
		}
		fmt.Println(p)
	}
}
