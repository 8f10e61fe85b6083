package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// torchPython returns Debian's python with torch, or skips.
func torchPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{os.Getenv("TORCH_PYTHON"), "/usr/bin/python3"} {
		if py == "" {
			continue
		}
		if exec.Command(py, "-c", "import torch.distributed").Run() == nil {
			return py
		}
	}
	testutil.SkipOrFail(t, "PyTorch not installed (apt-get install python3-torch)")
	return ""
}

func repoFile(t *testing.T, rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", rel)
}

var lossRE = regexp.MustCompile(`final: first_loss=([0-9.]+) last_loss=([0-9.]+) elastic_launched=(\w+)`)

func checkTrained(t *testing.T, out string) {
	t.Helper()
	m := lossRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no final line in output:\n%s", out)
	}
	first, _ := strconv.ParseFloat(m[1], 64)
	last, _ := strconv.ParseFloat(m[2], 64)
	if m[3] != "True" {
		t.Errorf("torch.distributed.is_torchelastic_launched() = %s", m[3])
	}
	if !(last < first/2) {
		t.Errorf("loss did not decrease: first %v last %v", first, last)
	}
}

func TestPyTorchDDPStandaloneFourWorkers(t *testing.T) {
	py := torchPython(t)
	r := hpr(t, []string{"PYTHON_EXEC=" + py}, "--standalone", "--nproc-per-node", "4",
		repoFile(t, "examples/pytorch/train_ddp.py"), "--steps", "25")
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "step=25 world_size=4") {
		t.Errorf("no step 25 at world size 4:\n%s", r.stdout)
	}
	checkTrained(t, r.stdout)
}

func TestPyTorchDDPTwoStaticNodes(t *testing.T) {
	py := torchPython(t)
	port := strconv.Itoa(freePort(t))
	var wg sync.WaitGroup
	res := make([]result, 2)
	for node := 0; node < 2; node++ {
		wg.Add(1)
		go func(node int) {
			defer wg.Done()
			res[node] = hpr(t, []string{"PYTHON_EXEC=" + py}, "--nnodes", "2", "--node-rank", strconv.Itoa(node),
				"--nproc-per-node", "2", "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", port,
				repoFile(t, "examples/pytorch/train_ddp.py"), "--steps", "25")
		}(node)
	}
	wg.Wait()
	for i, r := range res {
		if r.code != 0 {
			t.Fatalf("node %d exit %d:\n%s\n%s", i, r.code, r.stdout, r.stderr)
		}
	}
	if !strings.Contains(res[0].stdout, "world_size=4") {
		t.Errorf("node 0 did not train at world size 4:\n%s", res[0].stdout)
	}
	checkTrained(t, res[0].stdout)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
