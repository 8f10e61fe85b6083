package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3"); else
// the module version or VCS revision of the build is shown.
var version = ""

// examples formats a command's examples for its help.
func examples(lines ...string) string {
	return "Examples:\n   " + strings.Join(lines, "\n   ")
}

func outputFlag(choices string) cli.Flag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: choices}
}

func commands() []*cli.Command {
	return []*cli.Command{
		{
			Name: "submit", Usage: "submit jobs from a YAML file (one job per document)",
			Description: "Checks the whole file (every field, duplicate names, that each job's team exists)\n" +
				"before writing anything, then writes all its jobs at once: a file is submitted whole or not at all.\n" +
				"--dry-run writes nothing: it runs the coordinator's engine on the fleet as it is now,\n" +
				"with the file's jobs added, and shows what it would decide.\n\n" +
				examples("elasticctl submit -f job.yaml", "elasticctl submit -f jobs.yaml --dry-run", "cat job.yaml | elasticctl submit -f -"),
			Flags:  []cli.Flag{fileFlag(), &cli.BoolFlag{Name: "dry-run", Usage: "check the file and show what the coordinator would decide now; write nothing"}},
			Action: withStore(checkFile, cmdSubmit),
		},
		{
			Name: "apply", Usage: "create or update teams, or jobs, from a YAML file",
			Description: "A file with a \"teams:\" list (or a bare list) creates or replaces teams and quotas.\n" +
				"A file of job documents creates the jobs that do not exist and updates those that do\n" +
				"(keeping their place in the queue); applying the same file again changes nothing.\n\n" +
				examples("elasticctl apply -f examples/teams.yaml", "elasticctl apply -f examples/job.yaml"),
			Flags:  []cli.Flag{fileFlag()},
			Action: withStore(checkFile, cmdApply),
		},
		{
			Name: "get", Usage: "list jobs, nodes or teams", ArgsUsage: "jobs|nodes|teams [NAME...]",
			Description: "REASON is the short code of the coordinator's latest decision; -o wide adds the full\n" +
				"sentence (as 'describe' shows it). -l selects on fields: team, state, flavor, priority,\n" +
				"priorityClass, elastic, reason for jobs; state, flavor for nodes; cohort, flavor for teams\n" +
				"(key=value, key!=value, comma-separated: all must hold).\n\n" +
				examples("elasticctl get jobs", "elasticctl get jobs sweep serve-train -o wide",
					"elasticctl get jobs --team research --state Pending --sort-by age",
					"elasticctl get jobs -l team=research,elastic=true -o name",
					"elasticctl get jobs -w", "elasticctl get nodes -o yaml"),
			Flags: []cli.Flag{
				outputFlag("table, wide, name, json or yaml"),
				&cli.StringFlag{Name: "selector", Aliases: []string{"l"}, Usage: "select on fields: key=value,key!=value"},
				&cli.StringFlag{Name: "team", Usage: "only the jobs of this team"},
				&cli.StringFlag{Name: "state", Usage: "only the jobs in this state (Pending, Running, Restarting, Suspended, Succeeded, Failed, ...)"},
				&cli.StringFlag{Name: "sort-by", Usage: "sort by a column: name, team, priority, state, nodes, age, reason (jobs); name, state, flavor, accelerators (nodes); name, cohort, weight, used (teams)"},
				&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "after the list, print every change as it happens (Ctrl-C stops)"},
			},
			Action: withStore(checkGet, cmdGet),
		},
		{
			Name: "describe", Usage: "explain a job, team or node", ArgsUsage: "job|team|node NAME",
			Description: "For a job: its spec, state and the coordinator's reason, who holds the capacity it waits\n" +
				"for, its place in its team's and cohort's queues, an estimated wait, and its history\n" +
				"(repeated decisions counted: \"x5 over 3m\").\n" +
				"--trace adds the job's last scale events as waterfalls of their traces (the coordinator's\n" +
				"decision, the node agents' and hyperpodruns' spans), read from Jaeger's query API\n" +
				"(--trace-query or $HYPERPOD_TRACE_QUERY); --svg FILE draws them too.\n\n" +
				examples("elasticctl describe job sweep", "elasticctl describe team research", "elasticctl describe node gpu-7 -o yaml",
					"elasticctl describe job sweep --trace --trace-query http://jaeger:16686"),
			Flags:  append([]cli.Flag{outputFlag("table, json or yaml")}, traceFlags()...),
			Action: withStore(checkDescribeTrace, cmdDescribe),
		},
		{
			Name: "resize", Usage: "change an elastic job's size bounds", ArgsUsage: "job NAME",
			Description: examples("elasticctl resize job sweep --max 2", "elasticctl resize job sweep --min 2 --max 8", "elasticctl resize job eval --nodes 1"),
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "min", Usage: "new minimum node count"}, &cli.IntFlag{Name: "max", Usage: "new maximum node count"},
				&cli.IntFlag{Name: "nodes", Usage: "pin the job at exactly this many nodes (min = max)"},
			},
			Action: withStore(checkResize, cmdResize),
		},
		{Name: "suspend", Usage: "suspend a job (releases its capacity)", ArgsUsage: "NAME",
			Description: examples("elasticctl suspend sweep"), Action: withStore(checkJobArg, setSuspended(true))},
		{Name: "resume", Usage: "resume a suspended job", ArgsUsage: "NAME",
			Description: examples("elasticctl resume sweep"), Action: withStore(checkJobArg, setSuspended(false))},
		{Name: "delete", Usage: "delete jobs (each name is tried; exit 1 if any could not be deleted)", ArgsUsage: "NAME...",
			Description: examples("elasticctl delete sweep", "elasticctl delete sweep eval"), Action: withStore(checkDeleteArgs, cmdDelete)},
		{
			Name: "events", Usage: "show scheduling decisions", ArgsUsage: "[JOB]",
			Description: "Events about a job are its own and those that took capacity for it.\n" +
				"--follow prints the last 10 events (or those --since/--tail select), then new ones.\n\n" +
				examples("elasticctl events --tail 20", "elasticctl events --for sweep --since 1h", "elasticctl events --since 2026-01-02T15:04:05Z -o json", "elasticctl events -f"),
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new events"},
				&cli.StringFlag{Name: "for", Usage: "only the events about this job (as the JOB argument)"},
				&cli.StringFlag{Name: "since", Usage: "only events since a duration ago (10m, 2h) or a time (RFC 3339)"},
				&cli.IntFlag{Name: "tail", Value: -1, Usage: "only the last N events"},
				outputFlag("table, json or yaml"),
			},
			Action: withStore(checkEvents, cmdEvents),
		},
		authCommand(),
		simulateCommand(),
		{
			Name: "completion", Usage: "print a shell completion script", ArgsUsage: "bash|zsh|fish",
			Description: examples("source <(elasticctl completion bash)", "elasticctl completion zsh > \"${fpath[1]}/_elasticctl\"",
				"elasticctl completion fish > ~/.config/fish/completions/elasticctl.fish"),
			Action: cmdCompletion,
		},
		{
			Name: "version", Usage: "print elasticctl's version",
			Description: examples("elasticctl version"),
			Action: func(c *cli.Context) error {
				if c.Args().Len() > 0 {
					return usage(c, "version takes no arguments")
				}
				_, err := fmt.Fprintf(c.App.Writer, "elasticctl %s\n", buildVersion())
				return err
			},
		},
	}
}

// buildVersion is the -X version, else the module version, else the VCS
// revision of the build.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		return "devel " + rev[:min(12, len(rev))] + dirty
	}
	if v == "" {
		v = "(devel)"
	}
	return v + " " + info.GoVersion
}

// checkArgs refuses fewer than lo or more than hi arguments (hi < 0: any).
func checkArgs(lo, hi int) func(c *cli.Context) error {
	return func(c *cli.Context) error {
		n := c.Args().Len()
		if n < lo {
			return usage(c, "%s needs %s", c.Command.Name, c.Command.ArgsUsage)
		}
		if hi >= 0 && n > hi {
			return usage(c, "%s: unexpected argument %q", c.Command.Name, c.Args().Get(hi))
		}
		return nil
	}
}

// parsedFile is what checkFile read: jobs, or teams.
type parsedFile struct {
	jobs  []loadedJob
	teams []policy.Team
}

// checkFile reads and checks submit's and apply's file before anything
// connects (standard input can be read only once: the result is kept in
// the app's metadata).
func checkFile(c *cli.Context) error {
	if err := checkArgs(0, 0)(c); err != nil {
		return err
	}
	file := c.String("filename")
	data, err := readFile(file)
	if err != nil {
		return err
	}
	var pf parsedFile
	if c.Command.Name == "apply" && isTeamsFile(data) {
		pf.teams, err = parseTeams(data, file)
	} else {
		pf.jobs, err = parseJobs(data, file)
	}
	if err != nil {
		return err
	}
	if c.App.Metadata == nil {
		c.App.Metadata = map[string]any{}
	}
	c.App.Metadata["file"] = &pf
	return nil
}

// fileOf is what checkFile read.
func fileOf(c *cli.Context) *parsedFile {
	pf, _ := c.App.Metadata["file"].(*parsedFile)
	if pf == nil {
		return &parsedFile{}
	}
	return pf
}

func checkJobArg(c *cli.Context) error {
	name := c.Args().First()
	if name == "" {
		return usage(c, "%s needs the job's name: elasticctl %s NAME", c.Command.Name, c.Command.Name)
	}
	if c.Args().Len() > 1 {
		return usage(c, "%s: unexpected argument %q (one job at a time)", c.Command.Name, c.Args().Get(1))
	}
	return nameArg(c, "job", name)
}

// checkDeleteArgs checks delete's job names (one or more).
func checkDeleteArgs(c *cli.Context) error {
	if c.Args().Len() == 0 {
		return usage(c, "%s needs the job's name: elasticctl %s NAME", c.Command.Name, c.Command.Name)
	}
	for _, name := range c.Args().Slice() {
		if err := nameArg(c, "job", name); err != nil {
			return err
		}
	}
	return nil
}

// resourceKind reads "jobs", "job", "nodes", ... as jobs, nodes or teams.
func resourceKind(w string) string {
	switch w {
	case "jobs", "job":
		return "jobs"
	case "nodes", "node", "no":
		return "nodes"
	case "teams", "team":
		return "teams"
	}
	return ""
}

func checkGet(c *cli.Context) error {
	w := c.Args().First()
	kind := resourceKind(w)
	if kind == "" {
		msg := fmt.Sprintf("get %q: choose jobs, nodes or teams", w)
		if w == "" {
			msg = "get needs what to list: jobs, nodes or teams"
		} else if s := closest(w, []string{"jobs", "nodes", "teams"}); s != "" {
			msg = fmt.Sprintf("get %q: did you mean 'get %s'?", w, s)
		}
		return usageIn{fmt.Errorf("%s", msg), "get"}
	}
	switch o := c.String("output"); o {
	case "table", "wide", "name", "json", "yaml":
	default:
		return usage(c, "-o %q: choose table, wide, name, json or yaml", o)
	}
	for _, name := range c.Args().Slice()[1:] {
		if kind != "nodes" {
			if err := nameArg(c, strings.TrimSuffix(kind, "s"), name); err != nil {
				return err
			}
		}
	}
	if kind != "jobs" && (c.IsSet("team") || c.IsSet("state")) {
		if kind != "nodes" || c.IsSet("team") {
			return usage(c, "--team and --state filter jobs; for %s use -l", kind)
		}
	}
	if _, err := parseSelector(c.String("selector"), selectorKeys[kind]); err != nil {
		return usage(c, "-l: %v", err)
	}
	if s := c.String("sort-by"); s != "" {
		if _, ok := sorters[kind][normalizeColumn(s)]; !ok {
			return usage(c, "--sort-by %q: choose %s", s, strings.Join(sortNames(kind), ", "))
		}
	}
	return nil
}

func checkDescribe(c *cli.Context) error {
	switch k := c.Args().Get(0); {
	case k == "":
		return usage(c, "describe needs a kind and a name: describe job|team|node NAME")
	case k == "jobs" || k == "teams" || k == "nodes":
		return usage(c, "describe %q: did you mean 'describe %s'?", k, strings.TrimSuffix(k, "s"))
	case k != "job" && k != "team" && k != "node":
		return usage(c, "describe %q: choose job, team or node", k)
	case c.Args().Get(1) == "":
		return usage(c, "describe needs a kind and a name: describe %s NAME", k)
	case c.Args().Len() > 2:
		return usage(c, "describe: unexpected argument %q (one %s at a time)", c.Args().Get(2), k)
	case k != "node":
		if err := nameArg(c, k, c.Args().Get(1)); err != nil {
			return err
		}
	}
	switch o := c.String("output"); o {
	case "table", "json", "yaml":
		return nil
	default:
		return usage(c, "-o %q: choose table, json or yaml", o)
	}
}

func checkResize(c *cli.Context) error {
	if c.Args().First() != "job" || c.Args().Get(1) == "" {
		return usage(c, "usage: elasticctl resize job NAME [--min N] [--max N] [--nodes N]")
	}
	if !c.IsSet("min") && !c.IsSet("max") && !c.IsSet("nodes") {
		return usage(c, "resize: give --min, --max or --nodes")
	}
	for _, f := range []string{"nodes", "min", "max"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return usage(c, "resize: --%s must be >= 1 (got %d); to stop the job, use 'elasticctl suspend %s'", f, c.Int(f), c.Args().Get(1))
		}
	}
	return nameArg(c, "job", c.Args().Get(1))
}

func checkEvents(c *cli.Context) error {
	if c.Args().Len() > 1 {
		return usage(c, "events: unexpected argument %q (one job at a time)", c.Args().Get(1))
	}
	if c.Args().Len() == 1 && c.IsSet("for") && c.Args().First() != c.String("for") {
		return usage(c, "events: give the job once, as JOB or as --for")
	}
	if j := eventsJob(c); j != "" {
		if err := nameArg(c, "job", j); err != nil {
			return err
		}
	}
	if _, err := parseSince(c.String("since"), timeNow()); err != nil {
		return usage(c, "--since %q: %v", c.String("since"), err)
	}
	if c.IsSet("tail") && c.Int("tail") < 0 {
		return usage(c, "--tail must be >= 0 (got %d)", c.Int("tail"))
	}
	switch o := c.String("output"); o {
	case "table", "json", "yaml":
		return nil
	default:
		return usage(c, "-o %q: choose table, json or yaml", o)
	}
}

func eventsJob(c *cli.Context) string {
	if j := c.String("for"); j != "" {
		return j
	}
	return c.Args().First()
}
