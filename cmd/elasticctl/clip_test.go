package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A spec written straight into etcd under a 1.4 MB key (a team's user can
// write any key under its own prefix) is reported, not printed whole: every
// user's `get jobs` and `describe` would otherwise print 1.4 MB of warning,
// and the coordinator log it every time it reads the spec.
func TestHugeJobNameIsClippedInWarnings(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	huge := strings.Repeat("x", 1400<<10)
	k := fleet.NewKeys(fleet.DefaultPrefix)
	for _, spec := range []struct{ key, name, team string }{
		{k.Spec("research", huge), "x", "research"},     // a key whose name is no DNS label
		{k.Spec("research", "short"), huge, "research"}, // a name that does not match its key
		{k.Spec("research", "other"), "other", huge},    // a team that does not match its key
	} {
		v, _ := json.Marshal(map[string]any{"name": spec.name, "team": spec.team})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := cli.Put(ctx, spec.key, string(v)); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"get", "jobs"}, {"get", "jobs", "-o", "json"}} {
			out, errs, _ := ctl(t, ep, args...)
			if n := len(out) + len(errs); n > 4<<10 {
				t.Errorf("elasticctl %v printed %d bytes for a malformed spec; want the name clipped:\n%.600s", args, n, errs)
			}
			if !strings.Contains(errs+out, "bytes)") {
				t.Errorf("elasticctl %v does not say the name was clipped (and how long it was):\n%.600s\n%.600s", args, out, errs)
			}
		}
		if _, err := cli.Delete(ctx, spec.key); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
}

// A container job that asks to mount the host's root (or containerd's
// socket) is refused at submit, with the reason and the fix, and nothing is
// written: no node would run it, and it must not wait in a queue for one.
func TestSubmitRefusesAMountOfTheHostsRoot(t *testing.T) {
	ep, _ := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	for _, src := range []string{"/", "/run/containerd/containerd.sock"} {
		job := `name: rooted
team: research
flavor: nvidia-h100-80gb
perNode: {accelerators: 8}
minNodes: 1
run:
  image: registry.example.com/research/train:v1
  script: /app/train.py
  mounts: [{source: "` + src + `", target: /host}]
`
		out, errs, code := ctl(t, ep, "submit", "-f", writeFile(t, "job.yaml", job))
		if code == 0 || !strings.Contains(errs, "run.mounts[0].source: "+src+" is ") || !strings.Contains(errs, "--allow-mount-source") {
			t.Errorf("submit of a job mounting %s: exit %d\nstdout: %s\nstderr: %s\nwant a refusal naming the mount and the fix", src, code, out, errs)
		}
		if got := mustCtl(t, ep, "get", "jobs"); strings.Contains(got, "rooted") {
			t.Errorf("the refused job was written:\n%s", got)
		}
	}
}
