package api

import (
	"fmt"
)

// ValidateName checks that a job or team name is a DNS-1123 label: 1 to
// 63 lowercase letters, digits and '-', starting and ending with a letter
// or digit, as Kubernetes names are. Such a name is one etcd key segment and
// one directory name: it can never escape its prefix or its log directory.
// what names the field in the error ("job name", "--rdzv-id").
func ValidateName(what, name string) error {
	if !isDNS1123Label(name) {
		return fmt.Errorf("%s %q: must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. llama-70b-sweep)", what, clipName(name))
	}
	return nil
}

// isDNS1123Label matches ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ with at most 63
// bytes, without a regular expression: the engine checks every job's name
// every cycle, and the regexp's backtracking was an eighth of a cycle.
func isDNS1123Label(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
