package etcdauth

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// EnsureTeamUser gives team its role (TeamRoleFor) and user, as Bootstrap
// does, on an etcd whose auth is on: for teams applied after the bootstrap
// (elasticctl apply, an ElasticTeam). cli must have etcd's root role (the
// coordinator's). A user that exists is kept with its password (created
// false); a new one gets a fresh password, handed to save before the user
// is created, so that no user exists whose password was not kept. When
// someone else (elasticctl auth bootstrap) created the user meanwhile, the
// kept password is not its: drop is called to forget it.
func EnsureTeamUser(ctx context.Context, cli *clientv3.Client, k fleet.Keys, team string, save func(user, password string) error, drop func() error) (created bool, err error) {
	r, err := TeamRoleFor(k, team)
	if err != nil {
		return false, err
	}
	if err := ensureRole(ctx, cli, r); err != nil {
		return false, err
	}
	err = call(ctx, func(ctx context.Context) error { _, err := cli.UserGet(ctx, r.Name); return err })
	switch {
	case err == nil:
	case gone(err):
		pw, err := NewPassword()
		if err != nil {
			return false, err
		}
		if err := save(r.Name, pw); err != nil {
			return false, fmt.Errorf("keep team %s's password: %w", team, err)
		}
		err = call(ctx, func(ctx context.Context) error { _, err := cli.UserAdd(ctx, r.Name, pw); return err })
		if already(err) {
			if err := drop(); err != nil {
				return false, fmt.Errorf("forget the password kept for team %s's user, created meanwhile by another: %w", team, err)
			}
		} else if err != nil {
			return false, fmt.Errorf("create user %s: %w", r.Name, err)
		}
		created = err == nil
	default:
		return false, fmt.Errorf("read user %s: %w", r.Name, err)
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.UserGrantRole(ctx, r.Name, r.Name); return err }); err != nil {
		return false, fmt.Errorf("grant role %s to user %s: %w", r.Name, r.Name, err)
	}
	return created, nil
}

// RemoveTeamUser deletes a deleted team's etcd user and role (what exists
// of them): whoever still holds its password can no longer log in. The
// caller checks first that the team has no record.
func RemoveTeamUser(ctx context.Context, cli *clientv3.Client, team string) error {
	if err := api.ValidateName("team", team); err != nil {
		return err
	}
	name := TeamRole(team)
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.UserDelete(ctx, name); return err }); err != nil && !gone(err) {
		return fmt.Errorf("delete team %s's etcd user: %w", team, err)
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.RoleDelete(ctx, name); return err }); err != nil && !gone(err) {
		return fmt.Errorf("delete team %s's etcd role: %w", team, err)
	}
	return nil
}
