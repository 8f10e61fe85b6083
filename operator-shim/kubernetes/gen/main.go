// Command gen writes the ElasticJob controller's Kubernetes manifests
// (CRDs, RBAC, Deployment; package manifests) into examples/kubernetes/.
// Run it from the repository root: go run ./operator-shim/kubernetes/gen
//
// -image names the image you built and pushed (make image IMAGE=...) in
// place of manifests.Image, as the Deployment's image and its
// --launcher-image; write such manifests elsewhere (-dir), the committed
// ones keep the default.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("gen", flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("dir", "examples/kubernetes", "where to write the manifests")
	image := fl.String("image", manifests.Image, "the controller's image, also its --launcher-image (make image IMAGE=... pushes one)")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if _, err := name.ParseReference(*image, name.StrictValidation); err != nil {
		fmt.Fprintf(stderr, "gen: -image %q: %v (want registry/repository:tag or @sha256:digest)\n", *image, err)
		return 2
	}
	files, err := manifests.Files()
	if err != nil {
		fmt.Fprintf(stderr, "gen: %v\n", err)
		return 1
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(*dir, n)
		data := bytes.ReplaceAll(files[n], []byte(manifests.Image), []byte(*image))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			fmt.Fprintf(stderr, "gen: %v (run it from the repository root, or pass -dir)\n", err)
			return 1
		}
		fmt.Fprintln(stdout, p)
	}
	return 0
}
