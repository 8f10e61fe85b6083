package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func main() {
	if os.Getenv("GOGC") == "" {
		// A short-lived command that decodes tens of thousands of records:
		// fewer collections of a young heap cost less than the memory.
		debug.SetGCPercent(400)
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// Exit statuses: the one convention of every command (see exitHelp).
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// exitHelp documents the exit statuses in --help.
const exitHelp = `EXIT STATUS:
   0  the command did what was asked
   1  the operation failed (a job or team not found, an invalid file, etcd unreachable, ...)
   2  the command line is wrong (unknown command or flag, missing or bad argument)`

// usageError is a mistake in the command line: exit status 2. cmd names
// the command whose help to point at ("" for the top level).
type usageError struct{ error }

// usageIn is a usage error of one command, pointing at its help.
type usageIn struct {
	err error
	cmd string
}

func (u usageIn) Error() string { return u.err.Error() }
func (u usageIn) Unwrap() error { return u.err }

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout)
	app.ErrWriter = stderr
	err := app.Run(interspersed(app, args))
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "elasticctl: %v\n", err)
	var ue usageError
	var ui usageIn
	switch {
	case errors.As(err, &ui):
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", strings.TrimSpace("elasticctl "+ui.cmd))
		return exitUsage
	case errors.As(err, &ue):
		return exitUsage
	}
	return exitFailed
}

// globalFlags are the flags every command takes (all take a value:
// interspersed relies on it).
func globalFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: []string{"ELASTICCTL_CONFIG"}, Usage: "config file with contexts (default $XDG_CONFIG_HOME/elasticctl/config.yaml or ~/.config/elasticctl/config.yaml)"},
		&cli.StringFlag{Name: "context", EnvVars: []string{"ELASTICCTL_CONTEXT"}, Usage: "context of the config file to use (default: its current-context)"},
	}, etcdSet.Flags()...)
}

// etcdSet is how elasticctl takes the --etcd-* flags: its own
// ELASTICCTL_ETCD_* variables before the HYPERPOD_ETCD_* ones, and a
// context of the config file (connection) before the defaults.
var etcdSet = etcdflags.Set{EnvPrefix: "ELASTICCTL_ETCD_", DefaultEndpoints: []string{etcdflags.DefaultEndpoint},
	Auth: "the --etcd-* flags (or the config context)"}

func newApp(stdout io.Writer) *cli.App {
	app := &cli.App{
		Name:  "elasticctl",
		Usage: "submit, inspect, explain and resize elastic jobs",
		Description: "Talks to the fleet's etcd (endpoints from flags, ELASTICCTL_* variables, or a context of\n" +
			"~/.config/elasticctl/config.yaml, in that order).\n\n" +
			"Examples:\n" +
			"   elasticctl apply -f teams.yaml\n" +
			"   elasticctl submit -f job.yaml --dry-run\n" +
			"   elasticctl get jobs --team research --state Pending --sort-by age\n" +
			"   elasticctl describe job sweep\n" +
			"   elasticctl events --for sweep --since 10m",
		Flags:           globalFlags(),
		Writer:          stdout,
		HideHelpCommand: true,
		HideVersion:     true,
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageIn{flagError(err, c.App.Flags), ""}
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			if c.Args().Len() == 0 {
				return cli.ShowAppHelp(c)
			}
			return usageIn{unknownCommand(c.Args().First(), c.App.Commands, ""), ""}
		},
		Commands: commands(),
	}
	app.CustomAppHelpTemplate = cli.AppHelpTemplate + "\n" + exitHelp + "\n"
	for _, cmd := range app.Commands {
		prepare(cmd, "")
	}
	return app
}

// prepare gives every command the usage-error convention (exit 2,
// did-you-mean for flags and subcommands) and the exit statuses in its help.
func prepare(cmd *cli.Command, parent string) {
	path := strings.TrimSpace(parent + " " + cmd.Name)
	cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error {
		return usageIn{flagError(err, cmd.Flags), path}
	}
	cmd.CustomHelpTemplate = cli.CommandHelpTemplate + "\n" + exitHelp + "\n"
	if len(cmd.Subcommands) > 0 {
		cmd.CustomHelpTemplate = cli.SubcommandHelpTemplate + "\n" + exitHelp + "\n"
	}
	for _, sub := range cmd.Subcommands {
		prepare(sub, path)
	}
}

// flagError rewrites the flag package's "flag provided but not defined: -x"
// with a did-you-mean among flags.
func flagError(err error, flags []cli.Flag) error {
	msg := err.Error()
	bad, ok := strings.CutPrefix(msg, "flag provided but not defined: ")
	if !ok {
		return err
	}
	name := strings.TrimLeft(bad, "-")
	var names []string
	for _, f := range flags {
		names = append(names, f.Names()...)
	}
	for _, f := range globalFlags() {
		names = append(names, f.Names()...)
	}
	out := fmt.Sprintf("unknown flag %s", dashed(name))
	if s := closest(name, names); s != "" {
		out += fmt.Sprintf(": did you mean %s?", dashed(s))
	}
	return errors.New(out)
}

func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// unknownCommand names a mistyped command and the closest real one.
func unknownCommand(word string, cmds []*cli.Command, parent string) error {
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	msg := fmt.Sprintf("unknown command %q", strings.TrimSpace(parent+" "+word))
	if s := closest(word, names); s != "" {
		msg += fmt.Sprintf(": did you mean '%s'?", strings.TrimSpace(parent+" "+s))
	} else {
		sort.Strings(names)
		msg += ": the commands are " + strings.Join(names, ", ")
	}
	return errors.New(msg)
}

// closest is the candidate nearest to word (edit distance at most 2, or a
// prefix either way), or "".
func closest(word string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(strings.ToLower(word), strings.ToLower(c))
		if len(word) >= 3 && (strings.HasPrefix(c, word) || strings.HasPrefix(word, c)) && d > 1 {
			d = 2
		}
		if d < bestD || (d == bestD && best != "" && len(c) < len(best)) {
			best, bestD = c, d
		}
	}
	if bestD > 2 || (bestD >= len(word) && len(word) < 3) {
		return ""
	}
	return best
}

// editDistance is the Damerau-Levenshtein (optimal string alignment)
// distance.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// interspersed moves a subcommand's flags that follow its arguments in
// front of them (kubectl style: "get nodes -o json"), since urfave/cli stops
// parsing flags at the first argument.
func interspersed(app *cli.App, args []string) []string {
	i := 1
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		if a := args[i]; !strings.Contains(a, "=") && a != "-h" && a != "--help" {
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
	if slices.Contains(flags, "-h") || slices.Contains(flags, "--help") {
		return out // "get jobs -h": the command's help, not a help topic "jobs"
	}
	return append(out, pos...)
}

func fileFlag() cli.Flag {
	return &cli.StringFlag{Name: "filename", Aliases: []string{"f"}, Required: true, Usage: "YAML file (- for standard input)"}
}

type action func(c *cli.Context, st *query.Store) error

// nameArg refuses a job or team name that is not a DNS-1123 label: such a
// name could escape its key prefix ("../nodes/node3").
func nameArg(c *cli.Context, kind, name string) error {
	if err := api.ValidateName(kind, name); err != nil {
		return usageIn{err, c.Command.FullName()}
	}
	return nil
}

// usage is a usage error of the running command.
func usage(c *cli.Context, format string, a ...any) error {
	return usageIn{fmt.Errorf(format, a...), c.Command.FullName()}
}

// withStore checks a command's arguments, then connects to etcd.
func withStore(check func(c *cli.Context) error, f action) cli.ActionFunc {
	return func(c *cli.Context) error {
		if check != nil {
			if err := check(c); err != nil {
				return err
			}
		}
		opts, prefix, err := connection(c)
		if err != nil {
			return err
		}
		if err := opts.Validate(); err != nil {
			return usageIn{err, c.Command.FullName()}
		}
		cli, err := etcdconn.Connect(c.Context, opts)
		if err != nil {
			return err
		}
		defer cli.Close()
		err = f(c, query.New(fleet.New(cli, prefix)))
		if fleet.IsPermissionDenied(err) {
			who := "this client"
			if opts.User != "" {
				who = fmt.Sprintf("etcd user %q", opts.User)
			}
			return fmt.Errorf("%w: %s may not do this; a team's user may change only its own team's jobs, and only admins teams and quotas (docs/security.md)", err, who)
		}
		return err
	}
}
