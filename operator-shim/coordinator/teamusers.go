package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
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
		created := false
		err := c.withinTerm(ctx, func(tctx context.Context) (err error) {
			created, err = etcdauth.EnsureTeamUser(tctx, c.cli, c.store.Keys, team, func(user, pw string) error {
				return c.store.PutTeamCreds(tctx, fleet.TeamCreds{Team: team, User: user, Password: pw})
			}, func() error { return c.store.DeleteTeamCreds(tctx, team) })
			return err
		})
		if errors.Is(err, errNotInTerm) {
			return
		}
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

// teamsGone picks, of the teams whose user this leader made sure of, those
// no longer in the view: candidates for removal, sorted. Only teams seen
// in the view this term are candidates, so the users elasticctl auth
// bootstrap makes before the teams are applied are never touched.
func teamsGone(madeSure map[string]bool, inView map[string]api.Team) []string {
	var gone []string
	for team := range madeSure {
		if _, ok := inView[team]; !ok {
			gone = append(gone, team)
		}
	}
	sort.Strings(gone)
	return gone
}

// removeTeamUsers deletes the etcd user, role and team-creds record of a
// team deleted while this coordinator leads (elasticctl delete team, an
// ElasticTeam deleted): whoever still holds its password can no longer log
// in. A team that left the view but still has a record (a malformed one,
// or a view not caught up) keeps its user. A failure is logged and tried
// again next cycle.
func (c *Coordinator) removeTeamUsers(ctx context.Context) {
	if !c.cfg.JobCredentials || c.view == nil {
		return
	}
	for _, team := range teamsGone(c.teamUsers, c.view.teams) {
		err := c.withinTerm(ctx, func(tctx context.Context) error { return c.removeTeamUser(tctx, team) })
		if errors.Is(err, errNotInTerm) {
			return
		}
		if errors.Is(err, errTeamStillThere) {
			continue
		}
		if err != nil {
			c.log.Warn("could not remove a deleted team's etcd user; trying again next cycle", "team", team, "err", err)
			continue
		}
		delete(c.teamUsers, team)
		c.log.Info("removed a deleted team's etcd user and its kept password", "team", team, "user", etcdauth.TeamRole(team))
	}
}

// errTeamStillThere: the team has a record, so its user stays.
var errTeamStillThere = errors.New("the team still has a record")

func (c *Coordinator) removeTeamUser(ctx context.Context, team string) error {
	r, err := c.cli.Get(ctx, c.store.Keys.Team(team), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read team %s's record: %w", team, err)
	}
	if r.Count > 0 {
		return errTeamStillThere
	}
	if err := etcdauth.RemoveTeamUser(ctx, c.cli, team); err != nil {
		return err
	}
	return c.store.DeleteTeamCreds(ctx, team)
}
