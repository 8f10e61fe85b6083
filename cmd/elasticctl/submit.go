package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// checkTeams refuses jobs whose team does not exist, naming the file and
// line of each.
func checkTeams(ctx context.Context, st *query.Store, jobs []loadedJob, warn io.Writer) ([]api.Team, error) {
	teams, bad, err := st.Teams(ctx)
	if err != nil {
		return nil, err
	}
	warnAll(warn, bad)
	have := map[string]bool{}
	var names []string
	for _, t := range teams {
		have[t.Name] = true
		names = append(names, t.Name)
	}
	var msgs []string
	for _, j := range jobs {
		if have[j.spec.Team] {
			continue
		}
		msg := fmt.Sprintf("%s:%d: team: team %q does not exist", j.file, j.teamLine, j.spec.Team)
		if s := closest(j.spec.Team, names); s != "" {
			msg += fmt.Sprintf(": did you mean %q?", s)
		} else {
			msg += ": 'elasticctl get teams' lists the teams; 'elasticctl apply -f teams.yaml' creates them"
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 {
		return nil, fmt.Errorf("%s\nnothing was submitted", strings.Join(capLines(msgs, 10), "\n"))
	}
	return teams, nil
}

// capLines keeps the first n lines and says how many more there were.
func capLines(lines []string, n int) []string {
	if len(lines) <= n {
		return lines
	}
	return append(lines[:n:n], fmt.Sprintf("... and %d more", len(lines)-n))
}

func cmdSubmit(c *cli.Context, st *query.Store) error {
	loaded := fileOf(c).jobs
	ctx, cancel := ctxOf(c)
	defer cancel()
	teams, err := checkTeams(ctx, st, loaded, c.App.ErrWriter)
	if err != nil {
		return err
	}
	now := timeNow().UTC()
	by := requester(c)
	jobs := make([]fleet.JobSpec, len(loaded))
	for i, j := range loaded {
		jobs[i] = j.spec
		jobs[i].RequestedBy = by // who submits, whatever the file says
		if jobs[i].SubmitTime.IsZero() {
			jobs[i].SubmitTime = now
		}
	}
	if c.Bool("dry-run") {
		return dryRun(ctx, c, st, teams, jobs, now)
	}
	if err := st.SubmitJobs(ctx, jobs); err != nil {
		return err
	}
	var b strings.Builder
	for _, j := range jobs {
		fmt.Fprintf(&b, "job/%s submitted\n", j.Name)
	}
	_, err = io.WriteString(c.App.Writer, b.String())
	return err
}

// dryRun runs the engine on the fleet as it is, with jobs added, and
// prints what it decides for them and for the jobs they would displace.
func dryRun(ctx context.Context, c *cli.Context, st *query.Store, teams []api.Team, jobs []fleet.JobSpec, now time.Time) error {
	state := policy.State{Now: now, Teams: teams}
	invs, bad, err := st.Nodes(ctx)
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	for _, inv := range invs {
		state.Nodes = append(state.Nodes, fleet.EngineNode(inv))
	}
	snap, bad, err := st.JobsSnapshot(ctx)
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	exists := map[string]bool{}
	for _, s := range snap.Jobs {
		exists[s.Name] = true
		if _, done := snap.Finished[s.Name]; !done {
			state.Jobs = append(state.Jobs, s.Job)
		}
	}
	for _, d := range snap.Desired {
		if d.Running() {
			state.Allocations = append(state.Allocations, d.Allocation)
		}
	}
	var clash []string
	mine := map[string]bool{}
	for _, j := range jobs {
		if exists[j.Name] {
			clash = append(clash, j.Name)
		}
		mine[j.Name] = true
		state.Jobs = append(state.Jobs, j.Job)
	}
	if len(clash) > 0 {
		return fmt.Errorf("%s already exist: submit would write nothing (delete them first, or use 'elasticctl apply -f')", strings.Join(quoteNames(clash), ", "))
	}
	d := policy.Schedule(state)
	w := c.App.Writer
	fmt.Fprintf(w, "Dry run: nothing was written. The engine, run now on the fleet as it is (%d nodes, %d jobs) with the engine's default settings, decides:\n",
		len(state.Nodes), len(snap.Jobs))
	tw := newTab(w)
	fmt.Fprintln(tw, "JOB\tDECISION\tNODES\tREASON\tWHY")
	var others []api.Reason
	for _, r := range d.Reasons {
		if !mine[r.Job] {
			if r.Kind == api.KindShrunk || r.Kind == api.KindPreempted || r.Kind == api.KindMoved {
				others = append(others, r)
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Job, dryKind(r.Kind), r.ToSize, orDash(string(r.Code)), r.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(others) > 0 {
		fmt.Fprintln(w, "It would also change running jobs:")
		for _, r := range others {
			fmt.Fprintf(w, "  %s\n", eventLine(fleet.Event{Reason: r}, ""))
		}
	}
	fmt.Fprintln(w, "The coordinator decides on its own settings (e.g. its stable period) and on the fleet when the jobs arrive: this is a preview, not a promise.")
	return nil
}

// dryKind words a decision in the conditional.
func dryKind(k api.ReasonKind) string {
	switch k {
	case api.KindAdmitted:
		return "would be admitted"
	case api.KindPending:
		return "would wait"
	case api.KindSuspended:
		return "would stay suspended"
	case api.KindInvalid:
		return "would be refused"
	}
	return "would be " + strings.ToLower(string(k))
}

// teamApplyVerb is what apply did to a team, in kubectl's words: created
// (none was stored), unchanged (the stored one is the same) or configured.
func teamApplyVerb(stored *api.Team, t api.Team) string {
	if stored == nil {
		return "created"
	}
	a, errA := json.Marshal(stored)
	b, errB := json.Marshal(t)
	if errA == nil && errB == nil && bytes.Equal(a, b) {
		return "unchanged"
	}
	return "configured"
}

func quoteNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("job %q", n)
	}
	return out
}

func cmdApply(c *cli.Context, st *query.Store) error {
	pf := fileOf(c)
	if pf.teams != nil {
		teams := pf.teams
		ctx, cancel := ctxOf(c)
		defer cancel()
		for _, t := range teams {
			old, err := st.Team(ctx, t.Name)
			if err != nil && !errors.Is(err, fleet.ErrNotFound) {
				return fmt.Errorf("apply: read team %s: %w", t.Name, err)
			}
			// Written even when unchanged: the write is what etcd's roles
			// check (only an admin applies teams).
			verb := teamApplyVerb(old, t)
			if err := st.PutTeam(ctx, t); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "team/%s %s\n", t.Name, verb)
		}
		return nil
	}
	loaded := pf.jobs
	ctx, cancel := ctxOf(c)
	defer cancel()
	if _, err := checkTeams(ctx, st, loaded, c.App.ErrWriter); err != nil {
		return errors.New(strings.Replace(err.Error(), "nothing was submitted", "nothing was applied", 1))
	}
	jobs := make([]fleet.JobSpec, len(loaded))
	for i, j := range loaded {
		jobs[i] = j.spec
	}
	res, err := st.ApplyJobs(ctx, jobs, timeNow().UTC())
	for i, r := range res {
		if r != "" {
			fmt.Fprintf(c.App.Writer, "job/%s %s\n", jobs[i].Name, r)
		}
	}
	return err
}

// bufTab is a tabwriter writing through a buffer: one write per 64 KiB,
// not one per cell.
type bufTab struct {
	*tabwriter.Writer
	buf *bufio.Writer
}

// Flush aligns and writes out everything.
func (t bufTab) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	return t.buf.Flush()
}

func newTab(w io.Writer) bufTab {
	b := bufio.NewWriterSize(w, 64<<10)
	return bufTab{tabwriter.NewWriter(b, 0, 4, 2, ' ', 0), b}
}
