package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/sim"
)

// simulateCommand runs the policy engine in virtual time over a job trace,
// and generates synthetic traces shaped like public GPU cluster traces.
func simulateCommand() *cli.Command {
	return &cli.Command{
		Name:      "simulate",
		Usage:     "run the fair-share policy in virtual time over a job trace",
		ArgsUsage: " ",
		Description: "Runs the coordinator's engine over a trace (JSON lines or CSV) with the teams (and fleet) of a\n" +
			"YAML file, and reports per-team GPU utilization, queue waits, reclaim latency and preemptions.\n" +
			"'simulate generate' writes a synthetic trace shaped like the Helios GPU cluster traces.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "trace", Usage: "job trace file (.jsonl or .csv)"},
			&cli.StringFlag{Name: "teams", Usage: "teams (and optional fleet/config) YAML file"},
			&cli.StringFlag{Name: "mode", Value: "engine", Usage: "engine (hyperpodrun's policy) or fifo (static sizes, first come first served)"},
			&cli.Float64Flag{Name: "restart-delay", Value: 15, Usage: "seconds of checkpoint+restart charged to every resize or preemption"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"},
		},
		Subcommands: []*cli.Command{{
			Name:  "generate",
			Usage: "write a synthetic Helios-shaped trace (median 1 GPU, mean ~3.7; median 200 s, heavy tail)",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "jobs", Value: 1000}, &cli.Uint64Flag{Name: "seed", Value: 1},
				&cli.IntFlag{Name: "capacity", Value: 256, Usage: "fleet accelerators the load is sized for"},
				&cli.Float64Flag{Name: "load", Value: 1.0, Usage: "offered GPU-seconds per second per accelerator"},
				&cli.StringFlag{Name: "teams", Value: "a,b,c", Usage: "comma-separated team names sharing the load equally"},
				&cli.Float64Flag{Name: "elastic", Value: 0.5, Usage: "fraction of whole-node jobs that are elastic"},
				&cli.StringFlag{Name: "format", Value: "jsonl", Usage: "jsonl or csv"},
			},
			Action: func(c *cli.Context) error {
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
			},
		}},
		Action: func(c *cli.Context) error {
			if c.String("trace") == "" || c.String("teams") == "" {
				return usageError{errors.New("simulate needs --trace FILE and --teams FILE ('elasticctl simulate generate > trace.jsonl' makes a trace)")}
			}
			mode := sim.Mode(c.String("mode"))
			if mode != "engine" && mode != "fifo" {
				return usageError{fmt.Errorf("--mode %q: choose engine or fifo", mode)}
			}
			trace, err := sim.LoadTrace(c.String("trace"))
			if err != nil {
				return err
			}
			tf, err := sim.LoadTeams(c.String("teams"))
			if err != nil {
				return err
			}
			o := sim.Options{Mode: mode, Teams: tf.Teams, RestartDelay: c.Float64("restart-delay")}
			if len(tf.Fleet) > 0 {
				o.Fleet = sim.BuildFleet(tf.Fleet)
			}
			if tf.Config != nil {
				o.Config = *tf.Config
			}
			rep, err := sim.Run(trace, o)
			if err != nil {
				return err
			}
			switch c.String("output") {
			case "json":
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			case "table", "":
				_, err := fmt.Fprint(c.App.Writer, rep.Table())
				return err
			}
			return usageError{fmt.Errorf("-o %q: choose table or json", c.String("output"))}
		},
	}
}
