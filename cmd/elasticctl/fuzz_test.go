package main

import (
	"strings"
	"testing"
)

// Any file is an error or jobs, never a panic; errors never name a Go type.
func FuzzParseJobs(f *testing.F) {
	for _, seed := range []string{
		"name: x\nteam: t\nperNode: {accelerators: 1}\nrun: {script: a.py}\n",
		"name: x\nteam: t\nperNode: 3\n", "---\n---\n", "- a\n- b\n", "name: [1, 2]\nteam: {a: b}\n",
		"name: x\nteam: t\nperNode: {accelerators: 1, memory: lots}\nsubmitTime: yesterday\nrun: {script: a.py, env: {\"\": x}}\n",
		"name: x\n  team: : t\n", "? [a]\n: b\n", "name: &a x\nteam: *a\n", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		jobs, err := parseJobs([]byte(body), "f.yaml")
		if err == nil && len(jobs) == 0 {
			t.Fatal("no error and no job")
		}
		if err != nil {
			for _, goType := range []string{"api.", "policy.", "fleet.", "time.Time", "into "} {
				if strings.Contains(err.Error(), goType) {
					t.Fatalf("the error names a Go type (%s): %v", goType, err)
				}
			}
		}
		_ = isTeamsFile([]byte(body))
	})
}
