package ctrdtest

import (
	"archive/tar"
	"context"
	"io"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push builds through package ociimage: the files' layer, then Pad's, and
// the config the containerd tests rely on (PATH, entrypoint).
func TestPushWithPad(t *testing.T) {
	reg := StartRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref, err := reg.Push(ctx, "test/pad", "v1", Image{Files: []File{{Path: "bin/x", Data: []byte("x"), Mode: 0o755}},
		Env: []string{"A=1"}, Entrypoint: []string{"/bin/x"}, Pad: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := name.ParseReference(ref)
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Env) != 2 || cf.Config.Env[0] != "PATH=/usr/local/bin:/usr/bin:/bin" || cf.Config.Env[1] != "A=1" || cf.Config.Entrypoint[0] != "/bin/x" {
		t.Errorf("config %+v", cf.Config)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers (%v), want the files' and the pad's", len(layers), err)
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	size := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		size[h.Name] = h.Size
	}
	if size["pad/blob"] != 1<<20 {
		t.Errorf("the pad layer holds %v, want pad/blob of 1 MiB", size)
	}
	if c, _ := layers[1].Size(); c < 1<<20 {
		t.Errorf("the pad layer compresses to %d bytes: it must stay incompressible", c)
	}
}
