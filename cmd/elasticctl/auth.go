package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/urfave/cli/v2"
)

func authCommand() *cli.Command {
	return &cli.Command{
		Name:  "auth",
		Usage: "etcd users and roles of the fleet (docs/security.md)",
		Description: "etcd's own auth decides who may do what: a team's user changes only its team's jobs,\n" +
			"a job's user (minted by the coordinator) only its own rendezvous and checkpoint keys.\n\n" +
			examples("elasticctl auth bootstrap --password-dir /etc/hyperpod/etcd-passwords"),
		Subcommands: []*cli.Command{{
			Name:  "bootstrap",
			Usage: "create the fleet's roles and users on etcd, write their passwords, and turn etcd auth on",
			Description: "Creates the roles hyperpod-admin, hyperpod-coordinator, hyperpod-agent, hyperpod-team-<team>\n" +
				"(one per team: the teams in etcd plus every --team) and hyperpod-node-<node> (one per --node: that node's\n" +
				"agent may speak only for its own node), a user of each name and root, writes each new\n" +
				"user's password to <password-dir>/<user>.password (mode 0600), and enables auth. Run it again to add\n" +
				"teams: existing users keep their passwords. Once auth is on, connect as root to run it\n" +
				"(--etcd-user root --etcd-password-file <password-dir>/root.password).\n\n" +
				examples("elasticctl auth bootstrap --password-dir /etc/hyperpod/etcd-passwords",
					"elasticctl auth bootstrap --team research --team prod --password-dir ./pw",
					"elasticctl auth bootstrap --node node-0 --node node-1 --password-dir ./pw"),
			Flags: []cli.Flag{
				&cli.StringSliceFlag{Name: "team", Usage: "a team to create a role and user for (repeatable; the teams in etcd are added)"},
				&cli.StringSliceFlag{Name: "node", Usage: "a node to create a role and user for, hyperpod-node-<node> (repeatable; copy its password file to that node only)"},
				&cli.StringFlag{Name: "password-dir", Required: true, Usage: "directory for the new users' password files (created 0700)"},
			},
			Action: withStore(checkBootstrap, cmdBootstrap),
		}, {
			Name:      "add-node",
			Usage:     "create the etcd role and user of nodes added to the fleet (as root)",
			ArgsUsage: "NODE...",
			Description: "Creates hyperpod-node-<node> for each NODE: it may write only its own node record, liveness key and\n" +
				"reports, and read its own assignments (with the credentials of the jobs placed on it) and what users see.\n" +
				"Writes each new user's password to <password-dir>/hyperpod-node-<node>.password (mode 0600): copy it to that\n" +
				"node only. Existing users keep their passwords. Needs etcd's root user.\n\n" +
				examples("elasticctl --etcd-user root --etcd-password-file pw/root.password auth add-node node-7 --password-dir ./pw"),
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "password-dir", Required: true, Usage: "directory for the new users' password files (created 0700)"},
			},
			Action: withStore(checkAddNode, cmdAddNode),
		}},
	}
}

func checkBootstrap(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return usage(c, "bootstrap takes no arguments (teams go in --team)")
	}
	for _, t := range c.StringSlice("team") {
		if err := nameArg(c, "team", t); err != nil {
			return err
		}
	}
	return nodeArgs(c, c.StringSlice("node"))
}

// nodeArgs checks node names given on the command line.
func nodeArgs(c *cli.Context, nodes []string) error {
	for _, n := range nodes {
		if api.ValidateNodeName(n) != nil {
			if len(n) > 80 {
				n = n[:80] + "..."
			}
			return usage(c, "node %q: a node name is 1-253 characters [A-Za-z0-9._-], starting and ending with a letter or digit", n)
		}
	}
	return nil
}

func checkAddNode(c *cli.Context) error {
	if c.Args().Len() == 0 {
		return usage(c, "add-node needs at least one node name")
	}
	return nodeArgs(c, c.Args().Slice())
}

func cmdAddNode(c *cli.Context, st *query.Store) error {
	res, err := etcdauth.AddNodes(c.Context, st.Cli, st.Keys, c.Args().Slice(), c.String("password-dir"))
	if err != nil {
		return fmt.Errorf("auth add-node: %w", err)
	}
	printUsers(c, res, nil)
	return nil
}

// printUsers says which users were created (and where their passwords
// are) and which existed (fromRecord: those whose password file was written
// from the coordinator's record).
func printUsers(c *cli.Context, res *etcdauth.BootstrapResult, fromRecord map[string]string) {
	w := c.App.Writer
	users := make([]string, 0, len(res.Created))
	for u := range res.Created {
		users = append(users, u)
	}
	slices.Sort(users)
	for _, u := range users {
		fmt.Fprintf(w, "user %s created: password in %s\n", u, res.Created[u])
	}
	for _, u := range res.Kept {
		if p, ok := fromRecord[u]; ok {
			fmt.Fprintf(w, "user %s exists (created by the coordinator): password in %s\n", u, p)
			continue
		}
		fmt.Fprintf(w, "user %s exists: password unchanged\n", u)
	}
}

// writeTeamPasswords writes the password file of each kept team user the
// coordinator created (its team-creds record: a team applied after the
// first bootstrap) when the file is not there yet, and returns the files
// written by user.
func writeTeamPasswords(c *cli.Context, st *query.Store, kept []string, dir string) (map[string]string, error) {
	ctx, cancel := ctxOf(c)
	defer cancel()
	out := map[string]string{}
	for _, u := range kept {
		team, ok := strings.CutPrefix(u, etcdauth.TeamRole(""))
		if !ok || api.ValidateName("team", team) != nil {
			continue
		}
		p := filepath.Join(dir, u+".password")
		if _, err := os.Stat(p); err == nil {
			continue
		}
		cr, err := st.TeamCredsOf(ctx, team)
		if err != nil {
			return nil, fmt.Errorf("auth bootstrap: team %s's credentials: %w", team, err)
		}
		if cr == nil || cr.User != u {
			continue
		}
		if err := os.WriteFile(p, []byte(cr.Password+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("auth bootstrap: write %s's password: %w", u, err)
		}
		out[u] = p
	}
	return out, nil
}

func cmdBootstrap(c *cli.Context, st *query.Store) error {
	teams := slices.Clone(c.StringSlice("team"))
	known, bad, err := st.Teams(c.Context)
	if err != nil {
		return err
	}
	for _, b := range bad {
		fmt.Fprintf(c.App.ErrWriter, "warning: %v\n", b)
	}
	for _, t := range known {
		teams = append(teams, t.Name)
	}
	slices.Sort(teams)
	teams = slices.Compact(teams)
	for _, t := range teams {
		if err := api.ValidateName("team", t); err != nil {
			return err
		}
	}
	nodes := slices.Compact(slices.Sorted(slices.Values(c.StringSlice("node"))))
	res, err := etcdauth.BootstrapFleet(c.Context, st.Cli, st.Keys, etcdauth.Parties{Teams: teams, Nodes: nodes}, c.String("password-dir"))
	if err != nil {
		return fmt.Errorf("auth bootstrap: %w", err)
	}
	fromRecord, err := writeTeamPasswords(c, st, res.Kept, c.String("password-dir"))
	if err != nil {
		return err
	}
	printUsers(c, res, fromRecord)
	w := c.App.Writer
	if res.Enabled {
		fmt.Fprintln(w, "etcd auth is now on: every client needs a user (docs/security.md)")
	} else {
		fmt.Fprintln(w, "etcd auth was already on")
	}
	return nil
}
