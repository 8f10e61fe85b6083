// Command gen writes the ElasticJob controller's Kubernetes manifests
// (CRDs, RBAC, Deployment; package manifests) into examples/kubernetes/.
// Run it from the repository root: go run ./operator-shim/kubernetes/gen
//
// -image names the image you built and pushed (make image IMAGE=...) in
// place of manifests.Image, as the Deployment's image and its
// --launcher-image; write such manifests elsewhere (-dir), the committed
// ones keep the default. -etcd-endpoints and -etcd-prefix name your etcd
// (manifests.EtcdEndpoints and manifests.EtcdPrefixArg's by default) in the
// controller's Deployment and, with -dir elsewhere, in a copy of the agent
// DaemonSet (examples/kubernetes/daemonset.yaml) written there too.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("gen", flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("dir", "examples/kubernetes", "where to write the manifests")
	image := fl.String("image", manifests.Image, "the controller's image, also its --launcher-image (make image IMAGE=... pushes one)")
	endpoints := fl.String("etcd-endpoints", manifests.EtcdEndpoints, "the fleet's etcd endpoints, comma-separated, as the controller's and the agents' pods reach them")
	agentImage := fl.String("agent-image", manifests.AgentImage, "the node agent DaemonSet's image, in the copy of daemonset.yaml written into -dir (make agent-image IMAGE=... pushes one)")
	prefix := fl.String("etcd-prefix", strings.TrimPrefix(manifests.EtcdPrefixArg, "--etcd-prefix="), "the fleet's etcd prefix")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if err := checkEtcd(*endpoints, *prefix); err != nil {
		fmt.Fprintf(stderr, "gen: %v\n", err)
		return 2
	}
	for _, f := range []struct{ flag, ref string }{{"-image", *image}, {"-agent-image", *agentImage}} {
		if _, err := name.ParseReference(f.ref, name.StrictValidation); err != nil {
			fmt.Fprintf(stderr, "gen: %s %q: %v (want registry/repository:tag or @sha256:digest)\n", f.flag, f.ref, err)
			return 2
		}
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
	etcd := func(b []byte) []byte {
		b = bytes.ReplaceAll(b, []byte("--etcd-endpoints="+manifests.EtcdEndpoints+"\n"), []byte("--etcd-endpoints="+*endpoints+"\n"))
		return bytes.ReplaceAll(b, []byte(manifests.EtcdPrefixArg+"\n"), []byte("--etcd-prefix="+*prefix+"\n"))
	}
	if ds, err := os.ReadFile(filepath.Join("examples", "kubernetes", "daemonset.yaml")); err == nil && filepath.Clean(*dir) != filepath.Join("examples", "kubernetes") {
		files["daemonset.yaml"] = bytes.ReplaceAll(ds, []byte("image: "+manifests.AgentImage+"\n"), []byte("image: "+*agentImage+"\n"))
		names = append(names, "daemonset.yaml")
	}
	for _, n := range names {
		p := filepath.Join(*dir, n)
		data := etcd(bytes.ReplaceAll(files[n], []byte(manifests.Image), []byte(*image)))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			fmt.Fprintf(stderr, "gen: %v (run it from the repository root, or pass -dir)\n", err)
			return 1
		}
		fmt.Fprintln(stdout, p)
	}
	return 0
}

// checkEtcd refuses endpoints that are not URLs and a prefix that is not
// an absolute path, with what to give instead.
func checkEtcd(endpoints, prefix string) error {
	for _, e := range strings.Split(endpoints, ",") {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || strings.ContainsAny(e, " \n") {
			return fmt.Errorf("-etcd-endpoints: %q is not an endpoint URL (want https://host:2379[,https://host2:2379])", e)
		}
	}
	if !strings.HasPrefix(prefix, "/") || prefix == "/" || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "//") || strings.ContainsAny(prefix, " \t\n") {
		return fmt.Errorf("-etcd-prefix: %q must be an absolute key prefix such as /hyperpodrun", prefix)
	}
	return nil
}
