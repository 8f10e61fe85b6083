package launcher

import (
	"sort"
	"strings"
)

// envMap turns a KEY=VALUE list (os.Environ) into a map. A key given twice
// keeps its last value, as os/exec does.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

// mergeEnv layers environments, later layers winning, and returns each
// variable exactly once, sorted. A worker's environment must never hold two
// copies of one variable: getenv(3) returns the first, so an inherited
// RANK or MASTER_PORT would silently beat the one the rendezvous assigned.
func mergeEnv(layers ...map[string]string) []string {
	m := map[string]string{}
	for _, l := range layers {
		for k, v := range l {
			m[k] = v
		}
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
