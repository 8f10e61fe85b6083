package fleet

import (
	"strings"
	"testing"
)

func TestRunSpecContainerFieldsValidate(t *testing.T) {
	ok := RunSpec{Script: "/bin/worker", Image: "registry.example.com/team/train:v3", Command: []string{"/usr/local/bin/hyperpodrun"},
		Mounts: []Mount{{Source: "/data/ckpt", Target: "/ckpt"}}, ShmSize: 1 << 30}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a good container spec: %v", err)
	}
	for _, c := range []struct {
		mut  func(*RunSpec)
		want string
	}{
		{func(r *RunSpec) { r.Image = "Not A Ref!" }, `run.image: "Not A Ref!" is not an image reference`},
		{func(r *RunSpec) { r.Image = "" }, "run.command: needs run.image"},
		{func(r *RunSpec) { r.Image, r.Command = "", nil }, "run.mounts: needs run.image"},
		{func(r *RunSpec) { r.Mounts[0].Source = "data" }, `run.mounts[0].source: "data" must be a clean absolute path`},
		{func(r *RunSpec) { r.Mounts[0].Target = "/ckpt/../etc" }, "must be a clean absolute path"},
		{func(r *RunSpec) { r.Mounts[0].Target = "/" }, "cannot mount over the container's root"},
		{func(r *RunSpec) { r.Mounts[0].Target = "/run/hyperpodrun" }, "is the agent's"},
		{func(r *RunSpec) { r.Mounts[0].Target = "/var/log" }, "is the agent's"},
		{func(r *RunSpec) { r.Mounts[0].Target = "/.hyperpodrun/x" }, "is the agent's"},
		{func(r *RunSpec) { r.Mounts[0].Source = "/" }, "run.mounts[0].source: / is the host's root file system: no node lets a job mount it"},
		{func(r *RunSpec) { r.Mounts[0].Source = "/run/containerd" }, "the host's runtime sockets"},
		{func(r *RunSpec) { r.Mounts[0].Source = "/var" }, "a directory holding /var/run"},
		{func(r *RunSpec) { r.Mounts[0].Source = "/etc/hyperpod" }, "the host's configuration and credentials"},
		{func(r *RunSpec) { r.ShmSize = -1 }, "run.shmSize: must be positive"},
		{func(r *RunSpec) { r.Command = []string{""} }, "run.command: its first element"},
	} {
		r := ok
		r.Mounts = append([]Mount{}, ok.Mounts...)
		c.mut(&r)
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", r, err, c.want)
		}
	}
}
