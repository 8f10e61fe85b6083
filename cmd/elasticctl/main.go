// Command elasticctl submits, inspects, explains and resizes elastic jobs,
// manages teams and quotas, and simulates the fair-share policy on traces.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

type usageError struct{ error }

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout)
	app.ErrWriter = stderr
	if err := app.Run(interspersed(app, args)); err != nil {
		fmt.Fprintf(stderr, "elasticctl: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

func newApp(stdout io.Writer) *cli.App {
	output := &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table, json or yaml"}
	return &cli.App{
		Name:  "elasticctl",
		Usage: "submit, inspect, explain and resize elastic jobs",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "etcd-endpoints", EnvVars: []string{"ELASTICCTL_ETCD_ENDPOINTS"}, Value: "127.0.0.1:2379", Usage: "etcd endpoints, comma-separated"},
			&cli.StringFlag{Name: "etcd-prefix", EnvVars: []string{"ELASTICCTL_ETCD_PREFIX"}, Value: fleet.DefaultPrefix},
			&cli.StringFlag{Name: "etcd-cacert"}, &cli.StringFlag{Name: "etcd-cert"}, &cli.StringFlag{Name: "etcd-key"},
		},
		Writer:          stdout,
		HideHelpCommand: true,
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{err}
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			{Name: "submit", Usage: "submit jobs from a YAML file", Flags: []cli.Flag{fileFlag()}, Action: withStore(cmdSubmit)},
			{Name: "apply", Usage: "create or update teams and quotas from a YAML file", Flags: []cli.Flag{fileFlag()}, Action: withStore(cmdApply)},
			{Name: "get", Usage: "list jobs, nodes or teams", ArgsUsage: "jobs|nodes|teams", Flags: []cli.Flag{output}, Action: withStore(cmdGet)},
			{Name: "describe", Usage: "explain a job, team or node", ArgsUsage: "job|team|node NAME", Flags: []cli.Flag{output}, Action: withStore(cmdDescribe)},
			{Name: "resize", Usage: "change an elastic job's size bounds", ArgsUsage: "job NAME", Flags: []cli.Flag{
				&cli.IntFlag{Name: "min", Usage: "new minimum node count"}, &cli.IntFlag{Name: "max", Usage: "new maximum node count"},
				&cli.IntFlag{Name: "nodes", Usage: "pin the job at exactly this many nodes (min = max)"},
			}, Action: withStore(cmdResize)},
			{Name: "suspend", Usage: "suspend a job (releases its capacity)", ArgsUsage: "NAME", Action: withStore(setSuspended(true))},
			{Name: "resume", Usage: "resume a suspended job", ArgsUsage: "NAME", Action: withStore(setSuspended(false))},
			{Name: "delete", Usage: "delete a job", ArgsUsage: "NAME", Action: withStore(cmdDelete)},
			{Name: "events", Usage: "show scheduling decisions", ArgsUsage: "[JOB]", Flags: []cli.Flag{
				&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new events"}, output,
			}, Action: withStore(cmdEvents)},
			simulateCommand(),
		},
	}
}

// interspersed moves a subcommand's flags that follow its arguments in
// front of them (kubectl style: "get nodes -o json"), since urfave/cli stops
// parsing flags at the first argument.
func interspersed(app *cli.App, args []string) []string {
	i := 1
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		if !strings.Contains(args[i], "=") {
			i++ // global flags all take a value
		}
		i++
	}
	if i >= len(args) {
		return args
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return args
	}
	for i+1 < len(args) { // descend into subcommands ("simulate generate")
		sub := cmd.Command(args[i+1])
		if sub == nil {
			break
		}
		cmd, i = sub, i+1
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue["-"+n], takesValue["--"+n] = !isBool, !isBool
		}
	}
	var flags, pos []string
	rest := args[i+1:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			pos = append(pos, rest[j:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			if takesValue[a] && j+1 < len(rest) {
				flags = append(flags, rest[j+1])
				j++
			}
			continue
		}
		pos = append(pos, a)
	}
	out := append(append([]string{}, args[:i+1]...), flags...)
	return append(out, pos...)
}

func fileFlag() cli.Flag {
	return &cli.StringFlag{Name: "filename", Aliases: []string{"f"}, Required: true, Usage: "YAML file (- for standard input)"}
}

type action func(c *cli.Context, st *fleet.Store) error

// checks validates a command's arguments before anything connects.
var checks = map[string]func(c *cli.Context) error{
	"get": func(c *cli.Context) error {
		switch w := c.Args().First(); w {
		case "jobs", "job", "nodes", "node", "teams", "team":
			return nil
		default:
			return usageError{fmt.Errorf("get %q: choose jobs, nodes or teams", w)}
		}
	},
	"describe": func(c *cli.Context) error {
		switch k := c.Args().Get(0); {
		case k != "job" && k != "team" && k != "node":
			return usageError{fmt.Errorf("describe %q: choose job, team or node", k)}
		case c.Args().Get(1) == "":
			return usageError{errors.New("describe needs a kind and a name: describe job|team|node NAME")}
		case c.Args().Get(0) != "node":
			return nameArg(c.Args().Get(0), c.Args().Get(1))
		}
		return nil
	},
	"resize": func(c *cli.Context) error {
		if c.Args().First() != "job" || c.Args().Get(1) == "" {
			return usageError{errors.New("usage: elasticctl resize job NAME [--min N] [--max N] [--nodes N]")}
		}
		if !c.IsSet("min") && !c.IsSet("max") && !c.IsSet("nodes") {
			return usageError{errors.New("resize: give --min, --max or --nodes")}
		}
		return nameArg("job", c.Args().Get(1))
	},
}

// nameArg refuses a job or team name that is not a DNS-1123 label: such a
// name could escape its key prefix ("../nodes/node3").
func nameArg(kind, name string) error {
	if err := api.ValidateName(kind, name); err != nil {
		return usageError{err}
	}
	return nil
}

// withStore connects to etcd for a command.
func withStore(f action) cli.ActionFunc {
	return func(c *cli.Context) error {
		if check := checks[c.Command.Name]; check != nil {
			if err := check(c); err != nil {
				return err
			}
		}
		if o := c.String("output"); o != "" && o != "table" && o != "json" && o != "yaml" {
			return usageError{fmt.Errorf("-o %q: choose table, json or yaml", o)}
		}
		opts := etcdconn.Options{Endpoints: strings.Split(c.String("etcd-endpoints"), ","),
			CACert: c.String("etcd-cacert"), Cert: c.String("etcd-cert"), Key: c.String("etcd-key")}
		if err := opts.Validate(); err != nil {
			return usageError{err}
		}
		cli, err := etcdconn.Connect(c.Context, opts)
		if err != nil {
			return err
		}
		defer cli.Close()
		return f(c, fleet.New(cli, c.String("etcd-prefix")))
	}
}

func ctxOf(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, 15*time.Second)
}

func cmdSubmit(c *cli.Context, st *fleet.Store) error {
	jobs, err := loadJobs(c.String("filename"))
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	for _, j := range jobs {
		if j.SubmitTime.IsZero() {
			j.SubmitTime = time.Now().UTC()
		}
		if err := st.SubmitJob(ctx, j); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "job/%s submitted\n", j.Name)
	}
	return nil
}

func cmdApply(c *cli.Context, st *fleet.Store) error {
	teams, err := loadTeams(c.String("filename"))
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	for _, t := range teams {
		if err := st.PutTeam(ctx, t); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "team/%s configured\n", t.Name)
	}
	return nil
}

// printer renders v as JSON or YAML, or calls table.
func printOut(c *cli.Context, v any, table func(w *tabwriter.Writer)) error {
	switch o := c.String("output"); o {
	case "json":
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = c.App.Writer.Write(b)
		return err
	case "table", "":
		w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		table(w)
		return w.Flush()
	default:
		return usageError{fmt.Errorf("-o %q: choose table, json or yaml", o)}
	}
}

// jobView is a job with its state, for get/describe.
type jobView struct {
	Spec       fleet.JobSpec      `json:"spec"`
	Allocation *policy.Allocation `json:"allocation,omitempty"`
	Status     *fleet.Status      `json:"status,omitempty"`
	Finished   *fleet.Finish      `json:"finished,omitempty"`
}

func (v jobView) state() string {
	switch {
	case v.Finished != nil:
		return v.Finished.Outcome
	case v.Status != nil:
		return string(v.Status.Kind)
	}
	return "Submitted"
}

func (v jobView) size() int {
	if v.Allocation != nil {
		return v.Allocation.Size
	}
	return 0
}

func loadJobViews(ctx context.Context, st *fleet.Store, warn io.Writer) ([]jobView, error) {
	specs, bad, err := st.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range bad {
		fmt.Fprintf(warn, "warning: %v\n", b)
	}
	allocs, bad, err := st.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	warnAll(warn, bad)
	am := map[string]policy.Allocation{}
	for _, a := range allocs {
		am[a.Job] = a
	}
	stat, bad, err := st.Statuses(ctx)
	if err != nil {
		return nil, err
	}
	warnAll(warn, bad)
	fin, bad, err := st.Finished(ctx)
	if err != nil {
		return nil, err
	}
	warnAll(warn, bad)
	var out []jobView
	for _, s := range specs {
		v := jobView{Spec: s}
		if a, ok := am[s.Name]; ok {
			v.Allocation = &a
		}
		if x, ok := stat[s.Name]; ok {
			v.Status = &x
		}
		if f, ok := fin[s.Name]; ok {
			v.Finished = &f
		}
		out = append(out, v)
	}
	return out, nil
}

func cmdGet(c *cli.Context, st *fleet.Store) error {
	ctx, cancel := ctxOf(c)
	defer cancel()
	switch what := c.Args().First(); what {
	case "jobs", "job":
		jobs, err := loadJobViews(ctx, st, c.App.ErrWriter)
		if err != nil {
			return err
		}
		return printOut(c, jobs, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "NAME\tTEAM\tPRIORITY\tSTATE\tNODES\tMIN:MAX\tREASON")
			for _, j := range jobs {
				reason := ""
				if j.Status != nil {
					reason = j.Status.Message
				}
				prio, _ := j.Spec.ResolvePriority(policy.Config{})
				lo, hi := j.Spec.Bounds()
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%d:%d\t%s\n", j.Spec.Name, j.Spec.Team, prio, j.state(), j.size(), lo, hi, reason)
			}
		})
	case "nodes", "node":
		nodes, bad, err := st.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, b := range bad {
			fmt.Fprintf(c.App.ErrWriter, "warning: %v\n", b)
		}
		allocs, _, _ := st.Allocations(ctx)
		jobsOn := map[string][]string{}
		for _, a := range allocs {
			for _, n := range a.Nodes {
				jobsOn[n] = append(jobsOn[n], a.Job)
			}
		}
		return printOut(c, nodes, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "NAME\tSTATE\tFLAVOR\tACCELERATORS\tHEALTHY\tVCPUS\tMEMORY\tJOBS")
			for _, n := range nodes {
				h := 0
				for _, a := range n.Accelerators {
					if a.Healthy {
						h++
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", n.Node, orDash(n.State), n.Flavor, len(n.Accelerators), h, n.VCPUs,
					policy.ByteSize(n.MemoryBytes), strings.Join(jobsOn[n.Node], ","))
			}
		})
	case "teams", "team":
		teams, bad, err := st.Teams(ctx)
		if err != nil {
			return err
		}
		warnAll(c.App.ErrWriter, bad)
		usage, _ := st.Usage(ctx)
		return printOut(c, map[string]any{"teams": teams, "usage": usage}, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "TEAM\tCOHORT\tWEIGHT\tFLAVOR\tNOMINAL\tUSED\tBORROWED\tRUNNING\tPENDING")
			for _, u := range usage {
				var weight float64 = 1
				for _, t := range teams {
					if t.Name == u.Team {
						weight = weightOf(t)
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%g\t%s\t%d\t%d\t%d\t%d\t%d\n", u.Team, orDash(u.Cohort), weight, u.Flavor, u.Nominal, u.Used, u.Borrowed, u.Running, u.Pending)
			}
			if len(usage) == 0 {
				for _, t := range teams {
					for _, q := range t.Quotas {
						fmt.Fprintf(w, "%s\t%s\t%g\t%s\t%d\t-\t-\t-\t-\n", t.Name, orDash(t.Cohort), weightOf(t), q.Flavor, q.Nominal)
					}
				}
			}
		})
	default:
		return usageError{fmt.Errorf("get %q: choose jobs, nodes or teams", what)}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cmdDescribe(c *cli.Context, st *fleet.Store) error {
	ctx, cancel := ctxOf(c)
	defer cancel()
	kind, name := c.Args().Get(0), c.Args().Get(1)
	if name == "" {
		return usageError{errors.New("describe needs a kind and a name: describe job|team|node NAME")}
	}
	w := c.App.Writer
	switch kind {
	case "job":
		jobs, err := loadJobViews(ctx, st, c.App.ErrWriter)
		if err != nil {
			return err
		}
		var v *jobView
		for i := range jobs {
			if jobs[i].Spec.Name == name {
				v = &jobs[i]
			}
		}
		if v == nil {
			return fmt.Errorf("job %q not found: 'elasticctl get jobs' lists them", name)
		}
		history, bad, err := st.Events(ctx, name)
		if err != nil {
			return err
		}
		warnAll(c.App.ErrWriter, bad)
		if o := c.String("output"); o == "json" || o == "yaml" {
			return printOut(c, map[string]any{"job": v, "history": history}, nil)
		}
		describeJob(w, *v, history)
		return nil
	case "team":
		t, err := st.Team(ctx, name)
		if err != nil {
			return fmt.Errorf("team %q: %w", name, err)
		}
		usage, _ := st.Usage(ctx)
		jobs, _ := loadJobViews(ctx, st, c.App.ErrWriter)
		if o := c.String("output"); o == "json" || o == "yaml" {
			return printOut(c, t, nil)
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
	case "node":
		nodes, _, err := st.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Node == name {
				if o := c.String("output"); o == "json" || o == "yaml" {
					return printOut(c, n, nil)
				}
				if err := n.WriteTable(w); err != nil {
					return err
				}
				// The work placed on the node.
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
		}
		return fmt.Errorf("node %q not found: 'elasticctl get nodes' lists the registered nodes", name)
	}
	return usageError{fmt.Errorf("describe %q: choose job, team or node", kind)}
}

func limit(l *int) string {
	if l == nil {
		return "none"
	}
	return fmt.Sprint(*l)
}

func describeJob(w io.Writer, v jobView, history []fleet.Event) {
	s := v.Spec
	prio, _ := s.ResolvePriority(policy.Config{})
	lo, hi := s.Bounds()
	size := fmt.Sprintf("%d..%d nodes", lo, hi)
	if len(s.Sizes) > 0 {
		size += fmt.Sprintf(", sizes %v", s.Sizes)
	}
	fmt.Fprintf(w, "Job:        %s\nTeam:       %s\nPriority:   %d\nFlavor:     %s\nPer node:   %d accelerator(s)\nSize:       %s (elastic: %v)\nState:      %s\n",
		s.Name, s.Team, prio, orDash(s.Flavor), s.PerNode.Accelerators, size, s.Elastic, v.state())
	if v.Allocation != nil {
		fmt.Fprintf(w, "Nodes:      %s (since %s)\n", strings.Join(v.Allocation.Nodes, ", "), v.Allocation.Since.Format(time.RFC3339))
	}
	if v.Finished != nil {
		fmt.Fprintf(w, "Finished:   %s on %s at %s %s\n", v.Finished.Outcome, v.Finished.Node, v.Finished.Time.Format(time.RFC3339), v.Finished.Message)
	}
	if st := v.Status; st != nil {
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
	fmt.Fprintln(w, "History:")
	if len(history) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, e := range history {
		fmt.Fprintf(w, "  %s  %s\n", e.Time.Format("15:04:05"), eventLine(e, s.Name))
	}
}

// eventLine renders an event from the point of view of job (or neutrally).
func eventLine(e fleet.Event, job string) string {
	if job != "" && e.Job != job {
		return fmt.Sprintf("took capacity from %s (%s %d -> %d): %s", e.Job, e.Kind, e.FromSize, e.ToSize, e.Message)
	}
	line := fmt.Sprintf("%s %s", e.Kind, e.Job)
	if e.FromSize != e.ToSize {
		line += fmt.Sprintf(" %d -> %d nodes", e.FromSize, e.ToSize)
	}
	line += ": " + e.Message
	if len(e.For) > 0 {
		line += fmt.Sprintf(" [for %s of team %s]", strings.Join(e.For, ","), e.ForTeam)
	}
	return line
}

func cmdResize(c *cli.Context, st *fleet.Store) error {
	if c.Args().First() != "job" || c.Args().Get(1) == "" {
		return usageError{errors.New("usage: elasticctl resize job NAME [--min N] [--max N] [--nodes N]")}
	}
	if !c.IsSet("min") && !c.IsSet("max") && !c.IsSet("nodes") {
		return usageError{errors.New("resize: give --min, --max or --nodes")}
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	for _, f := range []string{"nodes", "min", "max"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return usageError{fmt.Errorf("resize: --%s must be >= 1 (got %d); to stop the job, use 'elasticctl suspend %s'", f, c.Int(f), c.Args().Get(1))}
		}
	}
	j, err := st.UpdateJob(ctx, c.Args().Get(1), func(j *fleet.JobSpec) error {
		lo, hi := j.Bounds()
		if c.IsSet("nodes") {
			lo, hi = c.Int("nodes"), c.Int("nodes")
		}
		if c.IsSet("min") {
			lo = c.Int("min")
		}
		if c.IsSet("max") {
			hi = c.Int("max")
		}
		j.MinNodes, j.MaxNodes = lo, hi
		if len(j.Sizes) > 0 {
			// A job with discrete sizes keeps those within the new bounds.
			var kept []int
			for _, z := range j.Sizes {
				if z >= lo && z <= hi {
					kept = append(kept, z)
				}
			}
			if len(kept) == 0 {
				return usageError{fmt.Errorf("resize: none of job %s's allowed sizes %v is within %d..%d nodes", j.Name, j.Sizes, lo, hi)}
			}
			j.Sizes, j.MinNodes, j.MaxNodes = kept, kept[0], kept[len(kept)-1]
		}
		if err := j.Validate(policy.Config{}); err != nil {
			return usageError{fmt.Errorf("resize: %w", err)}
		}
		return nil
	})
	if err != nil {
		return err
	}
	lo, hi := j.Bounds()
	if len(j.Sizes) > 0 {
		fmt.Fprintf(c.App.Writer, "job/%s resized to %d..%d nodes (sizes %v)\n", j.Name, lo, hi, j.Sizes)
		return nil
	}
	fmt.Fprintf(c.App.Writer, "job/%s resized to %d..%d nodes\n", j.Name, lo, hi)
	return nil
}

func setSuspended(v bool) action {
	return func(c *cli.Context, st *fleet.Store) error {
		name := c.Args().First()
		if name == "" {
			return usageError{errors.New("give the job name")}
		}
		if err := nameArg("job", name); err != nil {
			return err
		}
		ctx, cancel := ctxOf(c)
		defer cancel()
		if _, err := st.UpdateJob(ctx, name, func(j *fleet.JobSpec) error { j.Suspended = v; return nil }); err != nil {
			return err
		}
		word := "resumed"
		if v {
			word = "suspended"
		}
		fmt.Fprintf(c.App.Writer, "job/%s %s\n", name, word)
		return nil
	}
}

func cmdDelete(c *cli.Context, st *fleet.Store) error {
	name := c.Args().First()
	if name == "" {
		return usageError{errors.New("give the job name")}
	}
	if err := nameArg("job", name); err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	if err := st.DeleteJob(ctx, name); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "job/%s deleted\n", name)
	return nil
}

func cmdEvents(c *cli.Context, st *fleet.Store) error {
	job := c.Args().First()
	ctx, cancel := ctxOf(c)
	evs, bad, rev, err := st.EventsAt(ctx, job)
	cancel()
	if err != nil {
		return err
	}
	warnAll(c.App.ErrWriter, bad)
	if !c.Bool("follow") {
		return printOut(c, evs, func(w *tabwriter.Writer) {
			for _, e := range evs {
				fmt.Fprintf(w, "%s\t%s\n", e.Time.Format(time.RFC3339), eventLine(e, ""))
			}
		})
	}
	for _, e := range evs {
		printEvent(c, e)
	}
	fctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// From the revision after the history: nothing written in between is lost.
	for w := range st.Cli.Watch(fctx, st.Keys.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(rev+1)) {
		if w.Err() != nil {
			return w.Err()
		}
		sort.Slice(w.Events, func(i, j int) bool { return string(w.Events[i].Kv.Key) < string(w.Events[j].Kv.Key) })
		for _, ev := range w.Events {
			e, err := fleet.DecodeEvent(string(ev.Kv.Key), ev.Kv.Value)
			if err != nil {
				warnAll(c.App.ErrWriter, []error{err})
				continue
			}
			if e.Concerns(job) {
				printEvent(c, *e)
			}
		}
	}
	return nil
}

// warnAll prints the malformed records a read skipped.
func warnAll(w io.Writer, bad []error) {
	for _, b := range bad {
		fmt.Fprintf(w, "warning: %v\n", b)
	}
}

func printEvent(c *cli.Context, e fleet.Event) {
	switch c.String("output") {
	case "json":
		b, _ := json.Marshal(e)
		fmt.Fprintln(c.App.Writer, string(b))
		return
	case "yaml":
		b, _ := yaml.Marshal(e)
		fmt.Fprintf(c.App.Writer, "---\n%s", b)
		return
	}
	fmt.Fprintf(c.App.Writer, "%s  %s\n", e.Time.Format(time.RFC3339), eventLine(e, ""))
}

// weightOf is a team's fair-share weight as the engine uses it (unset: 1).
func weightOf(t policy.Team) float64 {
	if t.Weight > 0 {
		return t.Weight
	}
	return 1
}
