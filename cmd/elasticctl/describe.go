package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// queueInfo is a pending job's place in the queues it waits in, and an
// estimate of its wait.
type queueInfo struct {
	// TeamPosition and TeamPending: 1-based place among the team's pending
	// jobs of the flavor, in the engine's admission order.
	TeamPosition int `json:"teamPosition"`
	TeamPending  int `json:"teamPending"`
	// Cohort, CohortPosition and CohortPending: the same among the pending
	// jobs of every team of the cohort.
	Cohort         string `json:"cohort"`
	CohortPosition int    `json:"cohortPosition"`
	CohortPending  int    `json:"cohortPending"`
	// EstimatedWait is an estimate of the total time from submission to
	// admission; EstimateSource says how it was made. Both are empty when
	// there is nothing to estimate from.
	EstimatedWait  string `json:"estimatedWait,omitempty"`
	EstimateSource string `json:"estimateSource"`
}

// historyEntry is one deduplicated line of a job's history.
type historyEntry struct {
	First time.Time
	Last  time.Time
	Count int
	Line  string
}

// dedupHistory merges the events that say the same thing (kubectl's
// "x5 over 3m"), in the order each first happened.
func dedupHistory(evs []fleet.Event, job string) []historyEntry {
	var out []historyEntry
	at := map[string]int{}
	for _, e := range evs {
		line := eventLine(e, job)
		if i, ok := at[line]; ok {
			out[i].Count++
			out[i].Last = e.Time
			continue
		}
		at[line] = len(out)
		out = append(out, historyEntry{First: e.Time, Last: e.Time, Count: 1, Line: line})
	}
	return out
}

// span renders a duration briefly: 40s, 3m, 2h, 1d.
func span(d time.Duration) string {
	return age(time.Unix(0, 0), time.Unix(0, 0).Add(d))
}

func cmdDescribe(c *cli.Context, st *query.Store) error {
	ctx, cancel := ctxOf(c)
	defer cancel()
	kind, name := c.Args().Get(0), c.Args().Get(1)
	switch kind {
	case "job":
		return describeJobCmd(ctx, c, st, name)
	case "team":
		return describeTeam(ctx, c, st, name)
	}
	return describeNode(ctx, c, st, name)
}

func describeJobCmd(ctx context.Context, c *cli.Context, st *query.Store, name string) error {
	if err := api.ValidateName("job", name); err != nil {
		return err
	}
	now := timeNow()
	d, bad, err := st.JobHistory(ctx, name, func(r query.JobRecord) time.Time {
		if s := r.Spec.SubmitTime; !s.IsZero() && s.Before(now) {
			return s.Add(-time.Second) // the history of this job, not of an earlier namesake
		}
		return time.Time{}
	})
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	if d == nil {
		return fmt.Errorf("job %q not found: 'elasticctl get jobs' lists them", name)
	}
	v := viewOf(d.JobRecord)
	v.Problems = d.Problems
	if wr, err := st.WorkerRestarts(ctx, name); err != nil {
		// A team's user may not read the rendezvous: describe the rest.
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			warnAll(c.App.ErrWriter, []error{fmt.Errorf("restarts not shown: %w", err)})
		}
	} else if wr != nil {
		wr.MaxRestarts = v.Spec.Run.MaxRestarts
		v.WorkerRestarts = wr
	}
	history := d.History
	var queue *queueInfo
	if v.Finished == nil && v.Allocation == nil && !v.Spec.Suspended && v.Status != nil && v.Status.Kind == api.KindPending {
		if queue, err = queuePlace(ctx, st, v, c.App.ErrWriter); err != nil {
			return err
		}
	}
	if o := c.String("output"); o == "json" || o == "yaml" {
		out := map[string]any{"job": v, "history": nonNil(history)}
		if queue != nil {
			out["queue"] = queue
		}
		if c.Bool("trace") {
			ts, err := jobTraces(ctx, c.String("trace-query"), name, c.Int("trace-limit"))
			if err != nil {
				return err
			}
			out["traces"] = nonNil(ts)
		}
		if o == "json" {
			return writeJSON(c.App.Writer, out)
		}
		return writeYAML(c.App.Writer, out)
	}
	describeJob(c.App.Writer, v, history, queue)
	if !c.Bool("trace") {
		return nil
	}
	ts, err := jobTraces(ctx, c.String("trace-query"), name, c.Int("trace-limit"))
	if err != nil {
		return err
	}
	return writeTraces(c.App.Writer, name, c.String("trace-query"), ts, c.String("svg"))
}

// queuePlace finds a pending job's place in its team's and cohort's
// queues (the engine's admission order: priority, then submit time, then
// name) and estimates its wait. It reads the teams, the jobs' statuses and
// specs (at once; only the specs of the cohort's pending jobs and of the
// sample are decoded), then the desired records of the sample: the team's
// 50 most recently admitted running jobs.
func queuePlace(ctx context.Context, st *query.Store, v jobView, warn io.Writer) (*queueInfo, error) {
	// The teams are read while the statuses and specs are.
	type teamsRead struct {
		list []api.Team
		bad  []error
		err  error
	}
	tc := make(chan teamsRead, 1)
	go func() {
		var t teamsRead
		t.list, t.bad, t.err = st.Teams(ctx)
		tc <- t
	}()
	qs, qbad, qerr := st.QueueState(ctx)
	tr := <-tc
	if err := errors.Join(tr.err, qerr); err != nil {
		return nil, err
	}
	warnAll(warn, tr.bad)
	warnAll(warn, qbad)
	byTeam := map[string]api.Team{}
	for _, t := range tr.list {
		byTeam[t.Name] = t
	}
	team, ok := byTeam[v.Spec.Team]
	if !ok {
		return nil, nil
	}
	flavorOf := func(j api.Job) string {
		if j.Flavor != "" {
			return j.Flavor
		}
		if t, ok := byTeam[j.Team]; ok && len(t.Quotas) == 1 {
			return t.Quotas[0].Flavor
		}
		return ""
	}
	var pendingNames []string
	var running []*fleet.Status
	for n, s := range qs.Statuses {
		t, ok := byTeam[s.Team]
		if !ok || t.Cohort != team.Cohort {
			continue
		}
		switch {
		case s.Kind == api.KindPending:
			pendingNames = append(pendingNames, n)
		case s.Team == team.Name && s.ToSize > 0:
			running = append(running, s)
		}
	}
	// The most recently admitted running jobs of the team are the sample.
	sort.Slice(running, func(i, j int) bool { return running[i].Since.After(running[j].Since) })
	const samples = 50
	var runningNames []string
	for _, s := range running[:min(len(running), samples)] {
		runningNames = append(runningNames, s.Job)
	}
	specsOf, bad := qs.Specs(append(pendingNames, runningNames...))
	warnAll(warn, bad)
	desired, bad, err := st.DesiredAt(ctx, runningNames, qs.Revision)
	if err != nil {
		return nil, err
	}
	warnAll(warn, bad)
	var specs []*fleet.JobSpec
	for _, n := range pendingNames {
		if sp, ok := specsOf[n]; ok {
			specs = append(specs, sp)
		}
	}
	flavor := flavorOf(v.Spec.Job)
	var queue []api.Job
	for _, sp := range specs {
		if !sp.Suspended && flavorOf(sp.Job) == flavor {
			queue = append(queue, sp.Job)
		}
	}
	if !slices.ContainsFunc(queue, func(j api.Job) bool { return j.Name == v.Spec.Name }) {
		queue = append(queue, v.Spec.Job)
	}
	prio := func(j api.Job) int { p, _ := j.ResolvePriority(policy.Config{}); return p }
	slices.SortFunc(queue, func(a, b api.Job) int {
		if pa, pb := prio(a), prio(b); pa != pb {
			return pb - pa
		}
		if c := a.SubmitTime.Compare(b.SubmitTime); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	q := &queueInfo{Cohort: orDash(team.Cohort)}
	for _, j := range queue {
		q.CohortPending++
		if j.Team == team.Name {
			q.TeamPending++
		}
		if j.Name == v.Spec.Name {
			q.CohortPosition, q.TeamPosition = q.CohortPending, q.TeamPending
		}
	}
	estimateWait(q, team.Name, runningNames, specsOf, desired)
	return q, nil
}

// estimateWait sets q's estimated wait: the median time from submission to
// admission of the sampled running jobs (runningNames) of team.
func estimateWait(q *queueInfo, team string, runningNames []string, specsOf map[string]*fleet.JobSpec, desired map[string]*fleet.Desired) {
	var waits []time.Duration
	for _, n := range runningNames {
		sp, d := specsOf[n], desired[n]
		if sp == nil || !d.Running() || sp.SubmitTime.IsZero() {
			continue
		}
		if w := d.Since.Sub(sp.SubmitTime); w >= 0 {
			waits = append(waits, w)
		}
	}
	if len(waits) == 0 {
		q.EstimateSource = fmt.Sprintf("no estimate: no job of team %s is running to learn from", team)
		return
	}
	slices.Sort(waits)
	med := waits[len(waits)/2]
	q.EstimatedWait = span(med)
	q.EstimateSource = fmt.Sprintf("an estimate, not a promise: the median time from submission to admission of the %d most recently admitted jobs of team %s that are running now",
		len(waits), team)
}

func describeJob(w io.Writer, v jobView, history []fleet.Event, queue *queueInfo) {
	s := v.Spec
	lo, hi := s.Bounds()
	size := fmt.Sprintf("%d..%d nodes", lo, hi)
	if len(s.Sizes) > 0 {
		size += fmt.Sprintf(", sizes %v", s.Sizes)
	}
	fmt.Fprintf(w, "Job:        %s\nTeam:       %s\nPriority:   %d\nFlavor:     %s\nPer node:   %d accelerator(s)\nSize:       %s (elastic: %v)\nState:      %s\n",
		s.Name, s.Team, v.priority(), orDash(s.Flavor), s.PerNode.Accelerators, size, s.Elastic, v.phase())
	if !s.SubmitTime.IsZero() {
		fmt.Fprintf(w, "Submitted:  %s (%s ago)\n", s.SubmitTime.Format(time.RFC3339), age(s.SubmitTime, timeNow()))
	}
	if v.Allocation != nil {
		fmt.Fprintf(w, "Nodes:      %s (since %s)\n", strings.Join(v.Allocation.Nodes, ", "), v.Allocation.Since.Format(time.RFC3339))
	}
	if s.Run.Image != "" {
		fmt.Fprintf(w, "Image:      %s\n", s.Run.Image)
	}
	if v.Finished != nil {
		fmt.Fprintf(w, "Finished:   %s on %s at %s %s\n", v.Finished.Outcome, v.Finished.Node, v.Finished.Time.Format(time.RFC3339), v.Finished.Message)
	}
	for _, p := range v.Problems {
		fmt.Fprintf(w, "Problem:    on %s since %s: %s\n", p.Node, p.Time.Format(time.RFC3339), p.Message)
		if p.Restarts > 0 {
			fmt.Fprintf(w, "Restarts:   %d in a row on %s (maxRestarts %d)\nLast error: %s\n", p.Restarts, p.Node, s.Run.MaxRestarts, p.LastError)
		}
	}
	describeWorkerRestarts(w, v.WorkerRestarts)
	if v.WorkerRestarts != nil {
		describeCheckpointFailure(w, v.WorkerRestarts.CheckpointFailure)
	}
	if st := v.Status; st != nil {
		fmt.Fprintf(w, "Reason:     %s\n", orDash(string(st.Code)))
		fmt.Fprintf(w, "Why:        %s\n", st.Message)
		if len(st.Holders) > 0 {
			fmt.Fprintln(w, "Capacity held by:")
			for _, h := range st.Holders {
				b := ""
				if h.Borrowing {
					b = " (borrowing)"
				}
				fmt.Fprintf(w, "  %s of team %s: %d accelerator(s)%s\n", h.Job, h.Team, h.Accelerators, b)
			}
		}
	}
	if queue != nil {
		fmt.Fprintf(w, "Queue:      %d of %d pending in team %s; %d of %d pending in cohort %s\n",
			queue.TeamPosition, queue.TeamPending, s.Team, queue.CohortPosition, queue.CohortPending, queue.Cohort)
		if queue.EstimatedWait != "" {
			fmt.Fprintf(w, "Est. wait:  about %s from submission (%s)\n", queue.EstimatedWait, queue.EstimateSource)
		} else {
			fmt.Fprintf(w, "Est. wait:  %s\n", queue.EstimateSource)
		}
	}
	fmt.Fprintln(w, "History:")
	if len(history) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, h := range dedupHistory(history, s.Name) {
		line := fmt.Sprintf("  %s  %s", h.First.Format("15:04:05"), h.Line)
		if h.Count > 1 {
			line += fmt.Sprintf(" (x%d over %s, last at %s)", h.Count, span(h.Last.Sub(h.First)), h.Last.Format("15:04:05"))
		}
		fmt.Fprintln(w, line)
	}
}

func describeTeam(ctx context.Context, c *cli.Context, st *query.Store, name string) error {
	w := c.App.Writer
	t, err := st.Team(ctx, name)
	if errors.Is(err, fleet.ErrNotFound) {
		return fmt.Errorf("team %q not found: 'elasticctl get teams' lists them", name)
	}
	if err != nil {
		return fmt.Errorf("team %q: %w", name, err)
	}
	if o := c.String("output"); o == "json" {
		return writeJSON(w, t)
	} else if o == "yaml" {
		return writeYAML(w, t)
	}
	usage, err := st.Usage(ctx)
	if err != nil {
		return err
	}
	jobs, _, err := loadJobViews(ctx, st, c.App.ErrWriter, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Team:        %s\nCohort:      %s\nWeight:      %g\nPreemption:  %s\n", t.Name, orDash(t.Cohort), weightOf(*t), orDash(string(t.Preemption)))
	for _, q := range t.Quotas {
		fmt.Fprintf(w, "Quota %s: nominal %d, borrowing limit %s, lending limit %s\n", q.Flavor, q.Nominal, limit(q.BorrowingLimit), limit(q.LendingLimit))
	}
	for _, u := range usage {
		if u.Team == name {
			fmt.Fprintf(w, "Usage %s: %d of nominal %d used (%d borrowed); %d running, %d pending (%d accelerators waiting)\n",
				u.Flavor, u.Used, u.Nominal, u.Borrowed, u.Running, u.Pending, u.PendingAccelerators)
		}
	}
	fmt.Fprintln(w, "Jobs:")
	for _, j := range jobs {
		if j.Spec.Team == name {
			fmt.Fprintf(w, "  %s\t%s\t%d node(s)\n", j.Spec.Name, j.state(), j.size())
		}
	}
	return nil
}

func describeNode(ctx context.Context, c *cli.Context, st *query.Store, name string) error {
	w := c.App.Writer
	nodes, _, err := st.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Node != name {
			continue
		}
		switch c.String("output") {
		case "json":
			return writeJSON(w, n)
		case "yaml":
			return writeYAML(w, n)
		}
		if err := n.WriteTable(w); err != nil {
			return err
		}
		allocs, _, err := st.Allocations(ctx)
		if err != nil {
			return err
		}
		var jobs []string
		for _, a := range allocs {
			if slices.Contains(a.Nodes, name) {
				jobs = append(jobs, fmt.Sprintf("%s (team %s, %d accelerator(s))", a.Job, orDash(a.Team), a.AcceleratorsPerNode))
			}
		}
		sort.Strings(jobs)
		if len(jobs) == 0 {
			jobs = []string{"none"}
		}
		_, err = fmt.Fprintf(w, "Jobs:        %s\n", strings.Join(jobs, ", "))
		return err
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Node)
	}
	msg := fmt.Sprintf("node %q not found: 'elasticctl get nodes' lists the registered nodes", name)
	if s := closest(name, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return errors.New(msg)
}

// maxErrorLines bounds the failure summary describe prints.
const maxErrorLines = 20

// describeWorkerRestarts prints the restarts hyperpodrun made after worker
// failures and the last failure's summary (indented, at most
// maxErrorLines lines).
func describeWorkerRestarts(w io.Writer, r *fleet.WorkerRestarts) {
	if r == nil {
		return
	}
	if r.Count > 0 {
		fmt.Fprintf(w, "Restarts:   %d of maxRestarts %d (workers restarted by hyperpodrun after failures)\n", r.Count, r.MaxRestarts)
	}
	if r.LastError == "" {
		return
	}
	where := ""
	if r.LastNode != "" {
		where = " on " + r.LastNode
	}
	fmt.Fprintf(w, "Last error: round %d%s:\n", r.LastRound, where)
	lines := strings.Split(strings.TrimRight(r.LastError, "\n"), "\n")
	if len(lines) > maxErrorLines {
		lines = append(lines[:maxErrorLines], fmt.Sprintf("... (%d more lines: the node's log has all of it)", len(lines)-maxErrorLines))
	}
	for _, l := range lines {
		fmt.Fprintf(w, "            %s\n", l)
	}
}
