package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// timeNow is the clock (tests may replace it).
var timeNow = time.Now

// viewOf joins one job's records.
func viewOf(r query.JobRecord) jobView {
	// No status record: the desired record's implied one (a running job
	// has none while it runs as admitted).
	v := jobView{Spec: r.Spec, Status: fleet.StatusOf(r.Status, r.Desired), Finished: r.Finished, Problems: r.Problems}
	if r.Desired.Running() {
		a := r.Desired.Allocation
		v.Allocation = &a
	}
	return v
}

// loadJobViews reads every job (one revision) and returns it with that
// revision. listing reads only the fields a table shows (see
// query.Store.JobsListing); JSON and YAML need whole records.
func loadJobViews(ctx context.Context, st *query.Store, warn io.Writer, listing bool) ([]jobView, int64, error) {
	read := st.JobsSnapshot
	if listing {
		read = st.JobsListing
	}
	snap, bad, err := read(ctx)
	if err != nil {
		return nil, 0, err
	}
	warnAll(warn, bad)
	allocs := make(map[string]*fleet.Desired, len(snap.Desired))
	for _, d := range snap.Desired {
		allocs[d.Job] = d
	}
	out := make([]jobView, 0, len(snap.Jobs))
	for _, j := range snap.Jobs {
		v := viewOf(query.JobRecord{Spec: j, Desired: allocs[j.Name], Status: snap.Statuses[j.Name], Finished: snap.Finished[j.Name]})
		v.Problems = snap.Problems[j.Name]
		out = append(out, v)
	}
	addWorkerRestarts(ctx, st, out, snap.Revision, warn)
	return out, snap.Revision, nil
}

// loadNamedJobs reads only the named jobs; missing names are returned.
func loadNamedJobs(ctx context.Context, st *query.Store, names []string, warn io.Writer) ([]jobView, []string, int64, error) {
	recs, bad, rev, err := st.JobRecords(ctx, names)
	if err != nil {
		return nil, nil, 0, err
	}
	warnAll(warn, bad)
	var out []jobView
	var missing []string
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			continue
		}
		seen[n] = true
		if r, ok := recs[n]; ok {
			out = append(out, viewOf(r))
		} else {
			missing = append(missing, n)
		}
	}
	addWorkerRestarts(ctx, st, out, rev, warn)
	return out, missing, rev, nil
}

// restarting is the problem record of the node where the job's
// hyperpodrun keeps failing (the most failures in a row), nil if none.
func (v jobView) restarting() *fleet.Problem {
	var worst *fleet.Problem
	for i, p := range v.Problems {
		if p.Restarts > 0 && (worst == nil || p.Restarts > worst.Restarts) {
			worst = &v.Problems[i]
		}
	}
	return worst
}

// phase is the STATE of a job's table row: its state, or Restarting while
// a node keeps restarting its failing hyperpodrun (a crash loop) or
// hyperpodrun restarted the job's workers recently (workerRestarting).
func (v jobView) phase() string {
	if v.Finished == nil && (v.restarting() != nil || v.workerRestartingNow()) {
		return "Restarting"
	}
	return v.state()
}

// reasonCode is the short REASON of a job's table row.
func (v jobView) reasonCode() string {
	p := v.restarting()
	switch {
	case v.Finished == nil && p != nil:
		return fmt.Sprintf("Restarts:%d", p.Restarts)
	case v.workerRestartingNow():
		return fmt.Sprintf("Restarts:%d", v.WorkerRestarts.Count)
	case v.Finished != nil:
		return orDash(v.Finished.Message)
	case v.Status != nil && v.Status.Code != "":
		return string(v.Status.Code)
	}
	return "-"
}

// message is the full sentence behind the reason.
func (v jobView) message() string {
	p := v.restarting()
	switch {
	case v.Finished == nil && p != nil:
		return p.Message
	case v.workerRestartingNow():
		return workerRestartsMessage(v.WorkerRestarts, timeNow())
	case v.Finished != nil:
		return fmt.Sprintf("%s on %s", v.Finished.Outcome, v.Finished.Node)
	case v.Status != nil:
		return v.Status.Message
	}
	return "not yet seen by the coordinator"
}

func (v jobView) priority() int {
	p, _ := v.Spec.ResolvePriority(policy.Config{})
	return p
}

// age renders a duration as kubectl does: 45s, 12m, 5h, 3d.
func age(since time.Time, now time.Time) string {
	if since.IsZero() {
		return "-"
	}
	d := now.Sub(since)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// selectorKeys are the fields -l selects on, per kind.
var selectorKeys = map[string][]string{
	"jobs":  {"team", "state", "flavor", "priority", "priorityclass", "elastic", "reason", "suspended"},
	"nodes": {"state", "flavor"},
	"teams": {"cohort", "flavor"},
}

// requirement is one term of a selector.
type requirement struct {
	key, value string
	not        bool
}

// parseSelector parses "key=value,key!=value" over the allowed keys.
func parseSelector(sel string, keys []string) ([]requirement, error) {
	var out []requirement
	if strings.TrimSpace(sel) == "" {
		return nil, nil
	}
	for _, term := range strings.Split(sel, ",") {
		term = strings.TrimSpace(term)
		var r requirement
		switch {
		case strings.Contains(term, "!="):
			r.key, r.value, _ = strings.Cut(term, "!=")
			r.not = true
		case strings.Contains(term, "=="):
			r.key, r.value, _ = strings.Cut(term, "==")
		case strings.Contains(term, "="):
			r.key, r.value, _ = strings.Cut(term, "=")
		default:
			return nil, fmt.Errorf("%q: want key=value or key!=value", term)
		}
		r.key = strings.ToLower(strings.TrimSpace(r.key))
		r.value = strings.TrimSpace(r.value)
		if !slices.Contains(keys, r.key) {
			msg := fmt.Sprintf("unknown key %q: the keys are %s", r.key, strings.Join(keys, ", "))
			if s := closest(r.key, keys); s != "" {
				msg = fmt.Sprintf("unknown key %q: did you mean %q? (the keys are %s)", r.key, s, strings.Join(keys, ", "))
			}
			return nil, errors.New(msg)
		}
		out = append(out, r)
	}
	return out, nil
}

func matches(reqs []requirement, field func(key string) string) bool {
	for _, r := range reqs {
		if strings.EqualFold(field(r.key), r.value) == r.not {
			return false
		}
	}
	return true
}

func (v jobView) field(key string) string {
	switch key {
	case "team":
		return v.Spec.Team
	case "state":
		return v.phase()
	case "flavor":
		return v.Spec.Flavor
	case "priority":
		return strconv.Itoa(v.priority())
	case "priorityclass":
		return v.Spec.PriorityClass
	case "elastic":
		return strconv.FormatBool(v.Spec.Elastic)
	case "suspended":
		return strconv.FormatBool(v.Spec.Suspended)
	case "reason":
		return v.reasonCode()
	}
	return ""
}

// normalizeColumn reads "AGE", ".age", "{.age}" and "min:max" alike.
func normalizeColumn(s string) string {
	s = strings.ToLower(strings.Trim(s, "{}. "))
	s = strings.TrimPrefix(s, "spec.")
	return strings.ReplaceAll(s, "-", "")
}

// sorters compare rows by a column, per kind (ties: by name).
var sorters = map[string]map[string]func(a, b any) int{
	"jobs": {
		"name":     func(a, b any) int { return cmp.Compare(a.(jobView).Spec.Name, b.(jobView).Spec.Name) },
		"team":     func(a, b any) int { return cmp.Compare(a.(jobView).Spec.Team, b.(jobView).Spec.Team) },
		"priority": func(a, b any) int { return cmp.Compare(b.(jobView).priority(), a.(jobView).priority()) },
		"state":    func(a, b any) int { return cmp.Compare(a.(jobView).phase(), b.(jobView).phase()) },
		"nodes":    func(a, b any) int { return cmp.Compare(b.(jobView).size(), a.(jobView).size()) },
		"age":      func(a, b any) int { return a.(jobView).Spec.SubmitTime.Compare(b.(jobView).Spec.SubmitTime) },
		"reason":   func(a, b any) int { return cmp.Compare(a.(jobView).reasonCode(), b.(jobView).reasonCode()) },
	},
	"nodes": {
		"name":   func(a, b any) int { return cmp.Compare(a.(api.Inventory).Node, b.(api.Inventory).Node) },
		"state":  func(a, b any) int { return cmp.Compare(a.(api.Inventory).State, b.(api.Inventory).State) },
		"flavor": func(a, b any) int { return cmp.Compare(a.(api.Inventory).Flavor, b.(api.Inventory).Flavor) },
		"accelerators": func(a, b any) int {
			return cmp.Compare(len(b.(api.Inventory).Accelerators), len(a.(api.Inventory).Accelerators))
		},
	},
	"teams": {
		"name":   func(a, b any) int { return cmp.Compare(a.(teamRow).Team, b.(teamRow).Team) },
		"cohort": func(a, b any) int { return cmp.Compare(a.(teamRow).Cohort, b.(teamRow).Cohort) },
		"weight": func(a, b any) int { return cmp.Compare(b.(teamRow).weight, a.(teamRow).weight) },
		"used":   func(a, b any) int { return cmp.Compare(b.(teamRow).Used, a.(teamRow).Used) },
	},
}

func sortNames(kind string) []string {
	var out []string
	for k := range sorters[kind] {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// sortRows sorts stably by the --sort-by column (rows come in name order).
func sortRows[T any](c *cli.Context, kind string, rows []T) {
	by := c.String("sort-by")
	if by == "" {
		return
	}
	f := sorters[kind][normalizeColumn(by)]
	slices.SortStableFunc(rows, func(a, b T) int { return f(a, b) })
}

func cmdGet(c *cli.Context, st *query.Store) error {
	kind := resourceKind(c.Args().First())
	names := c.Args().Slice()[1:]
	switch kind {
	case "jobs":
		return getJobs(c, st, names)
	case "nodes":
		return getNodes(c, st, names)
	default:
		return getTeams(c, st, names)
	}
}

// notFound is the error for names that do not exist.
func notFound(kind string, missing []string) error {
	q := make([]string, len(missing))
	for i, m := range missing {
		q[i] = strconv.Quote(m)
	}
	noun := strings.TrimSuffix(kind, "s")
	if len(missing) > 1 {
		noun = kind
	}
	return fmt.Errorf("%s %s not found: 'elasticctl get %s' lists them", noun, strings.Join(q, ", "), kind)
}

func jobFilter(c *cli.Context) func(v jobView) bool {
	reqs, _ := parseSelector(c.String("selector"), selectorKeys["jobs"])
	team, state := c.String("team"), c.String("state")
	return func(v jobView) bool {
		return (team == "" || v.Spec.Team == team) && (state == "" || strings.EqualFold(v.phase(), state)) && matches(reqs, v.field)
	}
}

func getJobs(c *cli.Context, st *query.Store, names []string) error {
	ctx, cancel := ctxOf(c)
	var jobs []jobView
	var missing []string
	var rev int64
	var err error
	if len(names) > 0 {
		jobs, missing, rev, err = loadNamedJobs(ctx, st, names, c.App.ErrWriter)
	} else {
		jobs, rev, err = loadJobViews(ctx, st, c.App.ErrWriter, newJobPrinter(c).table() || c.String("output") == "name")
	}
	cancel()
	if err != nil {
		return err
	}
	keep := jobFilter(c)
	polled := newRestartsWatch(jobs) // before the filter: a watched job may come to match it
	rows := slices.DeleteFunc(jobs, func(j jobView) bool { return !keep(j) })
	sortRows(c, "jobs", rows)
	p := newJobPrinter(c)
	// With no rows, a table is only "No jobs found." (no header), as
	// kubectl prints; a watch keeps its header for the rows to come.
	if err := p.print(rows, len(rows) > 0 || !p.table() || c.Bool("watch")); err != nil {
		return err
	}
	if len(rows) == 0 && len(missing) == 0 && p.table() {
		fmt.Fprintln(c.App.ErrWriter, "No jobs found.")
	}
	if len(missing) > 0 {
		return notFound("jobs", missing)
	}
	if !c.Bool("watch") {
		return nil
	}
	return watchJobs(c, st, rev, names, keep, p, polled)
}

// jobPrinter prints job rows in the chosen output.
type jobPrinter struct {
	c   *cli.Context
	out string
	now func() time.Time
}

func newJobPrinter(c *cli.Context) *jobPrinter {
	return &jobPrinter{c: c, out: c.String("output"), now: timeNow}
}

func (p *jobPrinter) table() bool { return p.out == "table" || p.out == "wide" || p.out == "" }

// print prints rows; header says whether tables get their header line (a
// watch prints changed rows without one).
func (p *jobPrinter) print(rows []jobView, header bool) error {
	w := p.c.App.Writer
	switch p.out {
	case "name":
		var b strings.Builder
		for _, j := range rows {
			b.WriteString("job/" + j.Spec.Name + "\n")
		}
		_, err := io.WriteString(w, b.String())
		return err
	case "json":
		if !header { // watch: one object per line
			for _, j := range rows {
				b, err := json.Marshal(j)
				if err != nil {
					return err
				}
				fmt.Fprintln(w, string(b))
			}
			return nil
		}
		return writeJSON(w, rows)
	case "yaml":
		if !header {
			for _, j := range rows {
				b, err := yaml.Marshal(j)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "---\n%s", b)
			}
			return nil
		}
		return writeYAML(w, rows)
	}
	wide := p.out == "wide"
	cols := 8
	if wide {
		cols = 11
	}
	t := newTable(cols, len(rows)+1)
	if header {
		t.row("NAME", "TEAM", "PRIORITY", "STATE", "NODES", "MIN:MAX", "REASON", "AGE", "FLAVOR", "NODE-NAMES", "MESSAGE")
	}
	now := p.now()
	for _, j := range rows {
		lo, hi := j.Spec.Bounds()
		bounds := strconv.Itoa(lo) + ":" + strconv.Itoa(hi)
		if !wide {
			t.row(j.Spec.Name, j.Spec.Team, strconv.Itoa(j.priority()), j.phase(), strconv.Itoa(j.size()), bounds, j.reasonCode(), age(j.Spec.SubmitTime, now))
			continue
		}
		nodes := "-"
		if j.Allocation != nil && len(j.Allocation.Nodes) > 0 {
			nodes = strings.Join(j.Allocation.Nodes, ",")
		}
		t.row(j.Spec.Name, j.Spec.Team, strconv.Itoa(j.priority()), j.phase(), strconv.Itoa(j.size()), bounds, j.reasonCode(), age(j.Spec.SubmitTime, now),
			orDash(j.Spec.Flavor), nodes, j.message())
	}
	return t.write(w)
}

// table aligns columns as newTab's tabwriter does (each column as wide as
// its widest cell plus two spaces; the last column unpadded), for tables
// of thousands of rows: it measures once and writes each cell once.
type table struct {
	cols  int
	cells []string
}

func newTable(cols, rows int) *table {
	return &table{cols: cols, cells: make([]string, 0, cols*rows)}
}

// row adds a row of the table's columns (extra cells are dropped).
func (t *table) row(cells ...string) { t.cells = append(t.cells, cells[:t.cols]...) }

func (t *table) write(w io.Writer) error {
	width := make([]int, t.cols)
	for i, c := range t.cells {
		if col := i % t.cols; col < t.cols-1 {
			width[col] = max(width[col], utf8.RuneCountInString(c))
		}
	}
	b := bufio.NewWriterSize(w, 64<<10)
	const pad = "                                                                "
	for i, c := range t.cells {
		b.WriteString(c)
		col := i % t.cols
		if col == t.cols-1 {
			b.WriteByte('\n')
			continue
		}
		for n := width[col] + 2 - utf8.RuneCountInString(c); n > 0; n -= len(pad) {
			b.WriteString(pad[:min(n, len(pad))])
		}
	}
	return b.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// watchContext ends on Ctrl-C or SIGTERM, or with the command's context.
func watchContext(c *cli.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
}

// watchJobs prints the rows of jobs that change from revision rev on; a
// deleted job is printed once with state Deleted. Every restartsPoll it
// re-reads the running jobs' restart records (polled: the jobs as last
// printed), and prints a job that turned Restarting or stopped being it.
func watchJobs(c *cli.Context, st *query.Store, rev int64, names []string, keep func(jobView) bool, p *jobPrinter, polled *restartsWatch) error {
	ctx, stop := watchContext(c)
	defer stop()
	changes, errc := st.WatchJobs(ctx, rev+1)
	only := map[string]bool{}
	for _, n := range names {
		only[n] = true
	}
	tick := time.NewTicker(restartsPoll)
	defer tick.Stop()
	for {
		var batch []string
		select {
		case b, ok := <-changes:
			if !ok {
				return watchEnd(ctx, errc)
			}
			batch = b
		case <-tick.C:
			rows := polled.poll(ctx, st)
			if err := p.print(slices.DeleteFunc(rows, func(v jobView) bool { return !keep(v) }), false); err != nil {
				return err
			}
			continue
		}
		if len(only) > 0 {
			batch = slices.DeleteFunc(batch, func(n string) bool { return !only[n] })
		}
		if len(batch) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		views, gone, _, err := loadNamedJobs(rctx, st, batch, c.App.ErrWriter)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var rows []jobView
		for _, v := range views {
			if keep(v) {
				rows = append(rows, v)
			}
		}
		polled.seen(views)
		for _, g := range gone {
			v := jobView{Spec: &fleet.JobSpec{Job: api.Job{Name: g}}, Finished: &fleet.Finish{Outcome: "Deleted"}}
			rows = append(rows, v)
			polled.gone(g)
		}
		if err := p.print(rows, false); err != nil {
			return err
		}
	}
}

// watchEnd is how a watch ends once its changes stop: with the watch's
// error, unless the user ended it.
func watchEnd(ctx context.Context, errc <-chan error) error {
	select {
	case err := <-errc:
		if ctx.Err() == nil {
			return err
		}
	default:
	}
	return nil
}

func nodeFilter(c *cli.Context) func(n api.Inventory) bool {
	reqs, _ := parseSelector(c.String("selector"), selectorKeys["nodes"])
	state := c.String("state")
	return func(n api.Inventory) bool {
		f := func(k string) string {
			if k == "state" {
				return orDash(n.State)
			}
			return n.Flavor
		}
		return (state == "" || strings.EqualFold(f("state"), state)) && matches(reqs, f)
	}
}

func getNodes(c *cli.Context, st *query.Store, names []string) error {
	ctx, cancel := ctxOf(c)
	defer cancel()
	nodes, bad, rev, err := st.NodesAt(ctx)
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	allocs, _, err := st.Allocations(ctx)
	if err != nil {
		return err
	}
	jobsOn := map[string][]string{}
	for _, a := range allocs {
		for _, n := range a.Nodes {
			jobsOn[n] = append(jobsOn[n], a.Job)
		}
	}
	keep := nodeFilter(c)
	var missing []string
	if len(names) > 0 {
		byName := map[string]api.Inventory{}
		for _, n := range nodes {
			byName[n.Node] = n
		}
		var sel []api.Inventory
		for _, name := range names {
			if n, ok := byName[name]; ok {
				sel = append(sel, n)
			} else {
				missing = append(missing, name)
			}
		}
		nodes = sel
	}
	nodes = slices.DeleteFunc(nodes, func(n api.Inventory) bool { return !keep(n) })
	sortRows(c, "nodes", nodes)
	if err := printNodes(c, nodes, jobsOn, true); err != nil {
		return err
	}
	if len(missing) > 0 {
		return notFound("nodes", missing)
	}
	if !c.Bool("watch") {
		return nil
	}
	wctx, stop := watchContext(c)
	defer stop()
	changes, errc := st.WatchNodes(wctx, rev+1)
	for batch := range changes {
		rctx, cancel := context.WithTimeout(wctx, 15*time.Second)
		now, bad, _, err := st.NodesAt(rctx)
		cancel()
		if err != nil {
			if wctx.Err() != nil {
				return nil
			}
			return err
		}
		warnAll(c.App.ErrWriter, bad)
		byName := map[string]api.Inventory{}
		for _, n := range now {
			byName[n.Node] = n
		}
		var rows []api.Inventory
		for _, name := range batch {
			if len(names) > 0 && !slices.Contains(names, name) {
				continue
			}
			n, ok := byName[name]
			if !ok {
				n = api.Inventory{Node: name, State: "Gone"}
			}
			if keep(n) || !ok {
				rows = append(rows, n)
			}
		}
		if err := printNodes(c, rows, jobsOn, false); err != nil {
			return err
		}
	}
	select {
	case err := <-errc:
		if wctx.Err() == nil {
			return err
		}
	default:
	}
	return nil
}

func printNodes(c *cli.Context, nodes []api.Inventory, jobsOn map[string][]string, header bool) error {
	w := c.App.Writer
	switch c.String("output") {
	case "name":
		for _, n := range nodes {
			fmt.Fprintf(w, "node/%s\n", n.Node)
		}
		return nil
	case "json":
		if nodes == nil {
			nodes = []api.Inventory{}
		}
		return writeJSON(w, nodes)
	case "yaml":
		return writeYAML(w, nodes)
	}
	wide := c.String("output") == "wide"
	tw := newTab(w)
	if header {
		h := "NAME\tSTATE\tFLAVOR\tACCELERATORS\tHEALTHY\tVCPUS\tMEMORY\tJOBS"
		if wide {
			h += "\tHOSTNAME\tDRIVER\tUPDATED"
		}
		fmt.Fprintln(tw, h)
	}
	for _, n := range nodes {
		h := 0
		for _, a := range n.Accelerators {
			if a.Healthy {
				h++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s", n.Node, orDash(n.State), orDash(n.Flavor), len(n.Accelerators), h, n.VCPUs,
			policy.ByteSize(n.MemoryBytes), orDash(strings.Join(jobsOn[n.Node], ",")))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", orDash(n.Hostname), orDash(n.NVIDIADriver), age(n.UpdatedAt, timeNow())+" ago")
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// teamRow is one team's quota and usage on one flavor.
type teamRow struct {
	api.TeamUsage
	weight float64
}

func getTeams(c *cli.Context, st *query.Store, names []string) error {
	if err := printTeams(c, st, names, true); err != nil || !c.Bool("watch") {
		return err
	}
	wctx, stop := watchContext(c)
	defer stop()
	r, err := st.Cli.Get(wctx, st.Keys.Usage())
	if err != nil {
		return fmt.Errorf("watch teams: %w", err)
	}
	changes, errc := st.WatchTeams(wctx, r.Header.Revision+1)
	for range changes {
		if err := printTeams(c, st, names, false); err != nil {
			if wctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	select {
	case err := <-errc:
		if wctx.Err() == nil {
			return err
		}
	default:
	}
	return nil
}

func printTeams(c *cli.Context, st *query.Store, names []string, header bool) error {
	ctx, cancel := ctxOf(c)
	defer cancel()
	teams, bad, err := st.Teams(ctx)
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	usage, err := st.Usage(ctx)
	if err != nil {
		return err
	}
	var missing []string
	if len(names) > 0 {
		var sel []api.Team
		for _, n := range names {
			i := slices.IndexFunc(teams, func(t api.Team) bool { return t.Name == n })
			if i < 0 {
				missing = append(missing, n)
				continue
			}
			sel = append(sel, teams[i])
		}
		teams = sel
	}
	used := map[[2]string]api.TeamUsage{}
	for _, u := range usage {
		used[[2]string{u.Team, u.Flavor}] = u
	}
	var rows []teamRow
	for _, t := range teams {
		for _, q := range t.Quotas {
			u, ok := used[[2]string{t.Name, q.Flavor}]
			if !ok {
				u = api.TeamUsage{Team: t.Name, Cohort: t.Cohort, Flavor: q.Flavor, Nominal: q.Nominal}
			}
			u.Cohort = t.Cohort
			rows = append(rows, teamRow{TeamUsage: u, weight: weightOf(t)})
		}
	}
	reqs, _ := parseSelector(c.String("selector"), selectorKeys["teams"])
	rows = slices.DeleteFunc(rows, func(r teamRow) bool {
		return !matches(reqs, func(k string) string {
			if k == "cohort" {
				return r.Cohort
			}
			return r.Flavor
		})
	})
	if len(reqs) > 0 {
		keptTeams := map[string]bool{}
		for _, r := range rows {
			keptTeams[r.Team] = true
		}
		teams = slices.DeleteFunc(teams, func(t api.Team) bool { return !keptTeams[t.Name] })
		usage = slices.DeleteFunc(usage, func(u api.TeamUsage) bool { return !keptTeams[u.Team] })
	}
	sortRows(c, "teams", rows)
	w := c.App.Writer
	switch c.String("output") {
	case "name":
		for _, t := range teams {
			fmt.Fprintf(w, "team/%s\n", t.Name)
		}
	case "json":
		if err := writeJSON(w, map[string]any{"teams": nonNil(teams), "usage": nonNil(usage)}); err != nil {
			return err
		}
	case "yaml":
		if err := writeYAML(w, map[string]any{"teams": nonNil(teams), "usage": nonNil(usage)}); err != nil {
			return err
		}
	default:
		tw := newTab(w)
		if header {
			fmt.Fprintln(tw, "TEAM\tCOHORT\tWEIGHT\tFLAVOR\tNOMINAL\tUSED\tBORROWED\tRUNNING\tPENDING")
		}
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%g\t%s\t%d\t%d\t%d\t%d\t%d\n", r.Team, orDash(r.Cohort), r.weight, r.Flavor, r.Nominal, r.Used, r.Borrowed, r.Running, r.Pending)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		return notFound("teams", missing)
	}
	return nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
