package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// TeamCreds is a team's etcd user and password (team-creds/<team>), for a
// team the coordinator created the user of (etcd auth on, the team applied
// after elasticctl auth bootstrap). Only etcd's root role reads them;
// elasticctl auth bootstrap, run again as root, writes them to the
// team's password file.
type TeamCreds struct {
	Team     string `json:"team"`
	User     string `json:"user"`
	Password string `json:"password"`
}

// PutTeamCreds stores a team user's credentials.
func (s *Store) PutTeamCreds(ctx context.Context, c TeamCreds) error {
	if err := api.ValidateName("team", c.Team); err != nil {
		return err
	}
	if c.User == "" || c.Password == "" {
		return fmt.Errorf("team %s's credentials: user and password are required", c.Team)
	}
	return s.put(ctx, s.Keys.TeamCreds(c.Team), c)
}

// TeamCredsOf reads a team user's credentials (nil, nil when the
// coordinator created none: a user of elasticctl auth bootstrap, or auth
// off).
func (s *Store) TeamCredsOf(ctx context.Context, team string) (*TeamCreds, error) {
	if err := api.ValidateName("team", team); err != nil {
		return nil, err
	}
	c, err := getJSON[TeamCreds](ctx, s, s.Keys.TeamCreds(team))
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if c.Team != team || c.User == "" || c.Password == "" {
		return nil, fmt.Errorf("malformed credentials record at %s", s.Keys.TeamCreds(team))
	}
	return c, nil
}

// DeleteTeamCreds forgets a team user's credentials (none: no error).
func (s *Store) DeleteTeamCreds(ctx context.Context, team string) error {
	if err := api.ValidateName("team", team); err != nil {
		return err
	}
	key := s.Keys.TeamCreds(team)
	if _, err := s.Cli.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
