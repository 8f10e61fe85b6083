package kubetest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// ControlPlaneBinary returns the path of kube-controller-manager or
// kube-scheduler of Version: $KUBE_CONTROLLER_MANAGER or $KUBE_SCHEDULER,
// else the cache of `KUBE_CMD=<name> scripts/kube-apiserver.sh`; ok is
// false when it does not exist.
func ControlPlaneBinary(name string) (path string, ok bool) {
	return controlPlaneBinary(name).Path()
}

func controlPlaneBinary(name string) testutil.CachedBinary {
	return cached(name, strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
}

// StartControllerManager runs a real kube-controller-manager of Version
// against the server as the admin, with only the named controllers (e.g.
// "daemonset"), no leader election and no serving port, until the test
// ends. It skips the test when the binary is absent (fails it under $CI).
func (s *Server) StartControllerManager(t testing.TB, controllers ...string) {
	t.Helper()
	s.startControlPlane(t, "kube-controller-manager", "--controllers="+strings.Join(controllers, ","),
		"--use-service-account-credentials=false", "--concurrent-daemonset-syncs=1")
}

// StartScheduler runs a real kube-scheduler of Version against the server
// as the admin, without leader election or serving port, until the test
// ends. It skips the test when the binary is absent (fails it under $CI).
// Its log is printed when the test fails.
func (s *Server) StartScheduler(t testing.TB) {
	t.Helper()
	s.startControlPlane(t, "kube-scheduler")
}

func (s *Server) startControlPlane(t testing.TB, name string, args ...string) {
	t.Helper()
	bin := controlPlaneBinary(name).Require(t)
	dir := t.TempDir()
	logFile := filepath.Join(dir, name+".log")
	cmd, done, err := startLogged(logFile, nil, bin, append([]string{"--kubeconfig=" + s.Kubeconfig, "--leader-elect=false",
		"--secure-port=0", "--v=1"}, args...)...)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		stopDaemon(cmd, done)
		if t.Failed() {
			t.Logf("%s log (last 4 KB):\n%s", name, tailFile(logFile, 4096))
		}
	})
}
