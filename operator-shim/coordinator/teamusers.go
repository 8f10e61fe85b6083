package coordinator

import (
	"context"
	"sort"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// ensureTeamUsers gives every team in the view its etcd role and user, as
// elasticctl auth bootstrap does, when the coordinator mints credentials
// (Config.JobCredentials: auth on): a team applied after the bootstrap
// (elasticctl apply -f teams.yaml, an ElasticTeam) gets its user without
// the bootstrap being run again. A new user's password is kept in its
// team-creds record (root's to read; elasticctl auth bootstrap run again
// writes it to the team's password file). Each team is done once per
// leadership; a failure is logged and tried again next cycle.
func (c *Coordinator) ensureTeamUsers(ctx context.Context) {
	if !c.cfg.JobCredentials || c.view == nil {
		return
	}
	var todo []string
	for name := range c.view.teams {
		if !c.teamUsers[name] {
			todo = append(todo, name)
		}
	}
	if len(todo) == 0 {
		return
	}
	sort.Strings(todo)
	if c.teamUsers == nil {
		c.teamUsers = map[string]bool{}
	}
	for _, team := range todo {
		tctx, cancel := context.WithTimeout(ctx, credsTimeout)
		created, err := etcdauth.EnsureTeamUser(tctx, c.cli, c.store.Keys, team, func(user, pw string) error {
			return c.store.PutTeamCreds(tctx, fleet.TeamCreds{Team: team, User: user, Password: pw})
		}, func() error { return c.store.DeleteTeamCreds(tctx, team) })
		cancel()
		if err != nil {
			c.log.Warn("could not create the team's etcd user (the coordinator's etcd user needs the root role: docs/security.md); trying again next cycle", "team", team, "err", err)
			continue
		}
		if created {
			c.log.Info("created the team's etcd user; its password is in the team-creds record (elasticctl auth bootstrap, run again as root, writes it out)", "team", team, "user", etcdauth.TeamRole(team))
		}
		c.teamUsers[team] = true
	}
}
