package main

import (
	"encoding/json"
	"os/user"
	"strings"
	"testing"
)

// `elasticctl resize job sweep --max 1` of a job on 2 nodes is explained in
// describe as the user's resize, naming the user, not as lost nodes.
func TestUserResizeIsExplainedAsTheUsers(t *testing.T) {
	ep, cli := startFleet(t, 2)
	startCoordinator(t, cli)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", strings.Replace(elasticJob, "maxNodes: 4", "maxNodes: 2", 1)))
	waitJobRow(t, ep, "sweep", "2", "1:2")
	mustCtl(t, ep, "resize", "job", "sweep", "--max", "1")
	waitJobRow(t, ep, "sweep", "1", "1:1")
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	who := "user " + u.Username
	out := mustCtl(t, ep, "describe", "job", "sweep")
	for _, want := range []string{"Shrunk sweep 2 -> 1", "at the user's request: spec changed by " + who} {
		if !strings.Contains(out, want) {
			t.Errorf("describe job sweep lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "node(s) lost") {
		t.Errorf("describe job sweep blames lost nodes:\n%s", out)
	}
	// The decision's record names who asked (the status moves on to
	// Running at the next cycle; the history keeps the shrink).
	var d struct {
		History []struct {
			Kind, Code, RequestedBy string
		} `json:"history"`
	}
	js := mustCtl(t, ep, "describe", "job", "sweep", "-o", "json")
	if err := json.Unmarshal([]byte(js), &d); err != nil {
		t.Fatalf("describe -o json: %v\n%s", err, js)
	}
	found := false
	for _, h := range d.History {
		if h.Kind == "Shrunk" {
			found = true
			if h.Code != "SpecChanged" || h.RequestedBy != who {
				t.Errorf("describe -o json: the shrink's code %q, requestedBy %q; want SpecChanged by %q", h.Code, h.RequestedBy, who)
			}
		}
	}
	if !found {
		t.Errorf("describe -o json: no Shrunk event in the history\n%s", js)
	}
}
