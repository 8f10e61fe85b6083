package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		rule string
		args []string
		code int
		out  string // stdout or stderr that must name the usage
	}{
		{"--help prints the usage and exits 0", []string{"--help"}, 0, "stdout"},
		{"-h too", []string{"-h"}, 0, "stdout"},
		{"an unknown flag is bad usage, not an address", []string{"--verbose"}, 2, "stderr"},
		{"no address is bad usage", nil, 2, "stderr"},
		{"two arguments are bad usage", []string{"a:1", "b:2"}, 2, "stderr"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, stderr.String())
			}
			got := stdout.String()
			if tc.out == "stderr" {
				got = stderr.String()
			}
			if !strings.Contains(got, "usage: hyperpodrun-rdzv-host HOST:PORT") {
				t.Errorf("%s = %q, want the usage", tc.out, got)
			}
		})
	}
}
