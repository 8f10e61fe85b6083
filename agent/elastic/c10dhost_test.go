package elastic

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A host that finds the port taken prints "in-use" and exits at once.
// hyperpodrun must read that line every time (then it joins as a client):
// it once called Wait, which closes the pipe, before reading it, lost the
// line now and then, and failed the node ("exited: exit status 3").
func TestRdzvHostInUseIsNeverLost(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, rdzvHostBinary)
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho in-use\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if p, err := findRdzvHost(); err != nil || p != fake {
		t.Skipf("the host program resolves to %q (%v), not the fake", p, err)
	}
	for i := range 300 {
		h, err := startRdzvHost(context.Background(), "127.0.0.1:1")
		if h != nil {
			h.stop()
		}
		if !errors.Is(err, errInUse) {
			t.Fatalf("try %d: startRdzvHost = %v, want errInUse", i, err)
		}
	}
}
