package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/internal/tracestore"
)

// coordinatorService is the service name the coordinator's spans carry;
// its decision span (the root of a scale event's trace) has the job's name
// as its "job" attribute.
const coordinatorService = "hyperpod-coordinator"

// traceFlags are describe's flags for a job's traces.
func traceFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "trace", Usage: "jobs: after the description, the job's last resizes as waterfalls of their traces (spans of the coordinator, node agents and hyperpodruns), read from the trace store's query API"},
		&cli.StringFlag{Name: "trace-query", EnvVars: []string{"HYPERPOD_TRACE_QUERY"}, Value: "http://localhost:16686",
			Usage: "the base URL of the trace store's query API (Jaeger's query service)"},
		&cli.IntFlag{Name: "trace-limit", Value: 3, Usage: "how many of the job's last scale events --trace shows"},
		&cli.StringFlag{Name: "svg", Usage: "with --trace: also draw the waterfalls into this SVG file"},
	}
}

// checkTraceFlags refuses the trace flags where they mean nothing.
func checkTraceFlags(c *cli.Context) error {
	switch {
	case !c.Bool("trace") && c.IsSet("svg"):
		return usage(c, "describe: --svg draws the waterfalls of --trace: give --trace too")
	case c.Bool("trace") && c.Args().Get(0) != "job":
		return usage(c, "describe: --trace shows a job's resizes: describe job NAME --trace")
	case c.Int("trace-limit") < 1:
		return usage(c, "describe: --trace-limit must be >= 1 (got %d)", c.Int("trace-limit"))
	}
	return nil
}

// jobTraces reads the traces of job's last scale events, newest first.
func jobTraces(ctx context.Context, queryURL, job string, limit int) ([]tracestore.Trace, error) {
	ts, err := tracestore.NewClient(queryURL).Traces(ctx, coordinatorService, map[string]string{"job": job}, limit)
	if err != nil {
		return nil, fmt.Errorf("the job's traces: %w (is --trace-query/$HYPERPOD_TRACE_QUERY the trace store's query API?)", err)
	}
	if len(ts) > limit {
		ts = ts[:limit]
	}
	return ts, nil
}

// writeTraces prints the traces of job as text waterfalls, and with svg
// draws them into that file too.
func writeTraces(w io.Writer, job, queryURL string, ts []tracestore.Trace, svg string) error {
	fmt.Fprintf(w, "Traces:     the last %d scale event(s) of job %s, newest first (from %s)\n", len(ts), job, queryURL)
	if len(ts) == 0 {
		fmt.Fprintf(w, "  (none: is tracing on for the coordinator, OTEL_EXPORTER_OTLP_ENDPOINT, and does this store receive it?)\n")
	}
	ls := make([]tracestore.Layout, 0, len(ts))
	for _, t := range ts {
		l := tracestore.Waterfall(t)
		ls = append(ls, l)
		var b bytes.Buffer
		if err := tracestore.WriteText(&b, l, 40); err != nil {
			return err
		}
		fmt.Fprintf(w, "\n")
		for _, line := range bytes.SplitAfter(b.Bytes(), []byte("\n")) {
			if len(line) > 0 {
				w.Write(append([]byte("  "), line...))
			}
		}
	}
	if svg == "" {
		return nil
	}
	var b bytes.Buffer
	if err := tracestore.WriteSVG(&b, fmt.Sprintf("job %s: its last %d scale event(s)", job, len(ts)), ls); err != nil {
		return err
	}
	if err := os.WriteFile(svg, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write --svg: %w", err)
	}
	return nil
}

// checkDescribeTrace is describe's check, then the trace flags'.
func checkDescribeTrace(c *cli.Context) error {
	if err := checkDescribe(c); err != nil {
		return err
	}
	return checkTraceFlags(c)
}
