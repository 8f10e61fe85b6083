package api

import (
	"fmt"
	"regexp"
)

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidateName checks that a job or team name is a DNS-1123 label: 1 to
// 63 lowercase letters, digits and '-', starting and ending with a letter
// or digit, as Kubernetes names are. Such a name is one etcd key segment and
// one directory name: it can never escape its prefix or its log directory.
// what names the field in the error ("job name", "--rdzv-id").
func ValidateName(what, name string) error {
	if len(name) > 63 || !dns1123Label.MatchString(name) {
		return fmt.Errorf("%s %q: must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. llama-70b-sweep)", what, clipName(name))
	}
	return nil
}

func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
