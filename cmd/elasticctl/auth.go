package main

import (
	"fmt"
	"slices"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
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
			Description: "Creates the roles hyperpod-admin, hyperpod-coordinator, hyperpod-agent and hyperpod-team-<team>\n" +
				"(one per team: the teams in etcd plus every --team), a user of each name and root, writes each new\n" +
				"user's password to <password-dir>/<user>.password (mode 0600), and enables auth. Run it again to add\n" +
				"teams: existing users keep their passwords. Once auth is on, connect as root to run it\n" +
				"(--etcd-user root --etcd-password-file <password-dir>/root.password).\n\n" +
				examples("elasticctl auth bootstrap --password-dir /etc/hyperpod/etcd-passwords",
					"elasticctl auth bootstrap --team research --team prod --password-dir ./pw"),
			Flags: []cli.Flag{
				&cli.StringSliceFlag{Name: "team", Usage: "a team to create a role and user for (repeatable; the teams in etcd are added)"},
				&cli.StringFlag{Name: "password-dir", Required: true, Usage: "directory for the new users' password files (created 0700)"},
			},
			Action: withStore(checkBootstrap, cmdBootstrap),
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
	return nil
}

func cmdBootstrap(c *cli.Context, st *fleet.Store) error {
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
	res, err := etcdauth.Bootstrap(c.Context, st.Cli, st.Keys, teams, c.String("password-dir"))
	if err != nil {
		return fmt.Errorf("auth bootstrap: %w", err)
	}
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
		fmt.Fprintf(w, "user %s exists: password unchanged\n", u)
	}
	if res.Enabled {
		fmt.Fprintln(w, "etcd auth is now on: every client needs a user (docs/security.md)")
	} else {
		fmt.Fprintln(w, "etcd auth was already on")
	}
	return nil
}
