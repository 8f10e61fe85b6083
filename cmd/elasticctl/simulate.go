package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/sim"
)

// compareTable prints several policies' results side by side, then each
// report's per-team table.
func compareTable(c *cli.Context, reps []*sim.Report) error {
	tw := newTab(c.App.Writer)
	fmt.Fprintln(tw, "POLICY\tJOBS\tDONE\tREJECTED\tMEAN JCT\tJCT P95\tMEAN WAIT\tUTILIZATION %\tALLOCATED %\tBUSY UTIL %\tFAIRNESS\tWAIT P50\tWAIT P95\tRECLAIM P95\tPREEMPTIONS\tSHRINKS\tGROWS\tGPU-H LOST")
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0fs\t%.0fs\t%.0fs\t%.1f\t%.1f\t%.1f\t%.3f\t%.0fs\t%.0fs\t%.0fs\t%d\t%d\t%d\t%.1f\n", r.Mode, r.Jobs, r.Completed, r.Rejected,
			r.MeanJCT, r.JCTP95, r.MeanWait, r.Utilization, r.Allocated, r.BusyUtilization, r.Fairness,
			r.WaitP50, r.WaitP95, r.ReclaimP95, r.Preemptions, r.Shrinks, r.Grows, r.GPUHoursLost)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reps {
		fmt.Fprintln(c.App.Writer)
		if _, err := fmt.Fprint(c.App.Writer, r.Table()); err != nil {
			return err
		}
	}
	return nil
}

// simulateCommand runs the policy engine in virtual time over a job trace,
// and generates synthetic traces shaped like public GPU cluster traces.
func simulateCommand() *cli.Command {
	return &cli.Command{
		Name:      "simulate",
		Usage:     "run the fair-share policy in virtual time over a job trace",
		ArgsUsage: " ",
		Description: "Runs the coordinator's engine over a trace (JSON lines or CSV) with the teams (and fleet) of a\n" +
			"YAML file, and reports per-team GPU utilization, queue waits, reclaim latency and preemptions.\n" +
			"'simulate generate' writes a synthetic trace shaped like the Helios GPU cluster traces.\n\n" +
			examples("elasticctl simulate generate --jobs 1000 --teams a,b,c > trace.jsonl",
				"elasticctl simulate --trace trace.jsonl --teams examples/teams.yaml",
				"elasticctl simulate --trace trace.jsonl --teams teams.yaml --compare fifo,engine --report report.html",
				"elasticctl simulate --trace trace.jsonl --teams teams.yaml -o json > series.json"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "trace", Usage: "job trace file (.jsonl or .csv)"},
			&cli.StringFlag{Name: "teams", Usage: "teams (and optional fleet/config) YAML file"},
			&cli.StringFlag{Name: "mode", Value: "engine", Usage: "engine (hyperpodrun's policy), fifo, kueue or batch-fairshare (static sizes)"},
			&cli.Float64Flag{Name: "restart-delay", Value: 15, Usage: "seconds of checkpoint+restart charged to every resize or preemption"},
			&cli.Float64Flag{Name: "resize-delay", Usage: "seconds charged to a resize instead of --restart-delay (0.14: in-process resize, bench/elastic)"},
			&cli.Float64Flag{Name: "checkpoint-interval", Usage: "seconds between checkpoints: a preempted job loses half of it on average (0: nothing lost)"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table, json or yaml (json and yaml include the time series)"},
			&cli.StringFlag{Name: "report", Usage: "also write a self-contained HTML report with time-series charts to this file"},
			&cli.StringFlag{Name: "compare", Usage: "run several policies side by side: fifo,kueue,batch-fairshare,engine,oracle (oracle: the bound no policy beats; overrides --mode)"},
		},
		Subcommands: []*cli.Command{{
			Name:  "generate",
			Usage: "write a synthetic Helios-shaped trace (median 1 GPU, mean ~3.7; median 200 s, heavy tail)",
			Description: examples("elasticctl simulate generate --jobs 5000 --capacity 512 --teams a,b > trace.jsonl",
				"elasticctl simulate generate --format csv > trace.csv"),
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "jobs", Value: 1000}, &cli.Uint64Flag{Name: "seed", Value: 1},
				&cli.IntFlag{Name: "capacity", Value: 256, Usage: "fleet accelerators the load is sized for"},
				&cli.Float64Flag{Name: "load", Value: 1.0, Usage: "offered GPU-seconds per second per accelerator"},
				&cli.StringFlag{Name: "teams", Value: "a,b,c", Usage: "comma-separated team names sharing the load equally"},
				&cli.Float64Flag{Name: "elastic", Value: 0.5, Usage: "fraction of whole-node jobs that are elastic"},
				&cli.StringFlag{Name: "format", Value: "jsonl", Usage: "jsonl or csv"},
			},
			Action: simulateGenerate,
		}},
		Action: simulateRun,
	}
}

// simulateGenerate writes a synthetic trace (simulate generate).
func simulateGenerate(c *cli.Context) error {
	var loads []sim.TeamLoad
	for _, n := range strings.Split(c.String("teams"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			loads = append(loads, sim.TeamLoad{Name: n, Share: 1})
		}
	}
	if c.Int("jobs") < 1 || c.Int("capacity") < 1 || c.Float64("load") <= 0 {
		return usageError{errors.New("generate: --jobs, --capacity and --load must be positive")}
	}
	jobs := sim.Generate(sim.GenOptions{Seed: c.Uint64("seed"), Jobs: c.Int("jobs"), Teams: loads,
		Capacity: c.Int("capacity"), Load: c.Float64("load"), ElasticFraction: c.Float64("elastic")})
	switch c.String("format") {
	case "jsonl":
		return sim.WriteJSONL(c.App.Writer, jobs)
	case "csv":
		return sim.WriteCSV(c.App.Writer, jobs)
	}
	return usageError{fmt.Errorf("--format %q: choose jsonl or csv", c.String("format"))}
}

// simulateRun runs the policies over a trace and reports (simulate).
func simulateRun(c *cli.Context) error {
	if c.String("trace") == "" || c.String("teams") == "" {
		return usageError{errors.New("simulate needs --trace FILE and --teams FILE ('elasticctl simulate generate > trace.jsonl' makes a trace)")}
	}
	modes := []string{c.String("mode")}
	if c.IsSet("compare") {
		modes = nil
		for _, m := range strings.Split(c.String("compare"), ",") {
			if m = strings.TrimSpace(m); m != "" && !slices.Contains(modes, m) {
				modes = append(modes, m)
			}
		}
	}
	var ms []sim.Mode
	for _, m := range modes {
		if !slices.Contains(sim.Modes, sim.Mode(m)) || (m == string(sim.ModeOracle) && !c.IsSet("compare")) {
			return usage(c, "policy %q: choose engine, fifo, kueue or batch-fairshare (oracle with --compare)", m)
		}
		ms = append(ms, sim.Mode(m))
	}
	o := c.String("output")
	if o != "table" && o != "json" && o != "yaml" {
		return usage(c, "-o %q: choose table, json or yaml", o)
	}
	trace, err := sim.LoadTrace(c.String("trace"))
	if err != nil {
		return err
	}
	tf, err := sim.LoadTeams(c.String("teams"))
	if err != nil {
		return err
	}
	opts := sim.Options{Teams: tf.Teams, RestartDelay: c.Float64("restart-delay"),
		ResizeDelay: c.Float64("resize-delay"), CheckpointInterval: c.Float64("checkpoint-interval")}
	if len(tf.Fleet) > 0 {
		opts.Fleet = sim.BuildFleet(tf.Fleet)
	}
	if tf.Config != nil {
		opts.Config = *tf.Config
	}
	reps, err := sim.Compare(trace, ms, opts)
	if err != nil {
		return err
	}
	if path := c.String("report"); path != "" {
		var b strings.Builder
		if err := sim.WriteHTML(&b, fmt.Sprintf("Simulation of %s (%d jobs)", filepath.Base(c.String("trace")), len(trace)), reps); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
	}
	var v any = reps[0]
	if len(reps) > 1 {
		v = reps
	}
	switch o {
	case "json":
		return writeJSON(c.App.Writer, v)
	case "yaml":
		return writeYAML(c.App.Writer, v)
	}
	if len(reps) > 1 {
		return compareTable(c, reps)
	}
	if reps[0].Series != nil {
		reps[0].Series = nil
	}
	_, err = fmt.Fprint(c.App.Writer, reps[0].Table())
	return err
}
