package etcdauth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// opTimeout bounds every etcd call here.
const opTimeout = 10 * time.Second

// Users of the fleet besides teams and jobs.
const (
	RootUser        = "root"
	AdminUser       = "hyperpod-admin"
	CoordinatorUser = "hyperpod-coordinator"
	AgentUser       = "hyperpod-agent"
	// KubeControllerUser is hyperpod-kube-controller's user.
	KubeControllerUser = "hyperpod-kube-controller"
	// EnrollUser is the agent pods' shared enrollment user (EnrollRole).
	EnrollUser = EnrollRole
)

// NewPassword returns a random password (192 bits, URL-safe).
func NewPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func permType(a Access) clientv3.PermissionType {
	switch a {
	case Read:
		return clientv3.PermissionType(authpb.READ)
	case Write:
		return clientv3.PermissionType(authpb.WRITE)
	default:
		return clientv3.PermissionType(authpb.READWRITE)
	}
}

func call(ctx context.Context, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return f(cctx)
}

// already reports whether err says the user or role exists.
func already(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrUserAlreadyExist) || errors.Is(err, rpctypes.ErrRoleAlreadyExist)
}

// gone reports whether err says the user or role does not exist.
func gone(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrUserNotFound) || errors.Is(err, rpctypes.ErrRoleNotFound)
}

// ensureRole creates r (if missing), grants its permissions (granting an
// existing permission again is harmless) and revokes any other permission
// the role holds: an etcd bootstrapped by an earlier release loses what
// the role no longer grants (jobs/ to teams, creds/ to node agents).
func ensureRole(ctx context.Context, cli *clientv3.Client, r Role) error {
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.RoleAdd(ctx, r.Name); return err }); err != nil && !already(err) {
		return fmt.Errorf("create role %s: %w", r.Name, err)
	}
	want := map[[2]string]bool{}
	for _, p := range r.Perms {
		key, end := p.Key, ""
		if p.Prefix != "" {
			key, end = p.Prefix, clientv3.GetPrefixRangeEnd(p.Prefix)
		}
		want[[2]string{key, end}] = true
	}
	var held []*authpb.Permission
	if err := call(ctx, func(ctx context.Context) error {
		g, err := cli.RoleGet(ctx, r.Name)
		if err == nil {
			held = g.Perm
		}
		return err
	}); err != nil {
		return fmt.Errorf("read role %s: %w", r.Name, err)
	}
	for _, h := range held {
		if want[[2]string{string(h.Key), string(h.RangeEnd)}] {
			continue
		}
		if err := call(ctx, func(ctx context.Context) error {
			_, err := cli.RoleRevokePermission(ctx, r.Name, string(h.Key), string(h.RangeEnd))
			return err
		}); err != nil {
			return fmt.Errorf("revoke role %s's permission on %s: %w", r.Name, h.Key, err)
		}
	}
	for _, p := range r.Perms {
		key, end := p.Key, ""
		if p.Prefix != "" {
			key, end = p.Prefix, clientv3.GetPrefixRangeEnd(p.Prefix)
		}
		if err := call(ctx, func(ctx context.Context) error {
			_, err := cli.RoleGrantPermission(ctx, r.Name, key, end, permType(p.Access))
			return err
		}); err != nil {
			return fmt.Errorf("grant role %s %s on %s: %w", r.Name, p.Access, key, err)
		}
	}
	return nil
}

// ensureUser creates user with a new password and grants it roles; it
// returns the password, or "" when the user existed (its password is
// kept; the roles are granted all the same).
func ensureUser(ctx context.Context, cli *clientv3.Client, user string, roles ...string) (string, error) {
	pw, err := NewPassword()
	if err != nil {
		return "", err
	}
	err = call(ctx, func(ctx context.Context) error { _, err := cli.UserAdd(ctx, user, pw); return err })
	if already(err) {
		pw = ""
	} else if err != nil {
		return "", fmt.Errorf("create user %s: %w", user, err)
	}
	for _, r := range roles {
		if err := call(ctx, func(ctx context.Context) error { _, err := cli.UserGrantRole(ctx, user, r); return err }); err != nil {
			return "", fmt.Errorf("grant role %s to user %s: %w", r, user, err)
		}
	}
	return pw, nil
}

// BootstrapResult says what Bootstrap created.
type BootstrapResult struct {
	// Created lists the users created, each with its password file.
	Created map[string]string
	// Kept lists the users that existed (their passwords are unchanged).
	Kept []string
	// Enabled says auth was turned on by this run.
	Enabled bool
}

// Bootstrap creates the fleet's roles (FleetRoles, and one per team) and a
// user for each (root, admin, coordinator, agent, kube controller, and
// hyperpod-team-<team>) on the etcd cli talks to, writes each new user's
// password to <dir>/<user>.password (mode 0600, dir 0700), and turns auth
// on. It is idempotent: users that exist keep their passwords. cli must
// be unauthenticated (auth still off) or root's.
func Bootstrap(ctx context.Context, cli *clientv3.Client, k fleet.Keys, teams []string, dir string) (*BootstrapResult, error) {
	return BootstrapFleet(ctx, cli, k, Parties{Teams: teams}, dir)
}

// Parties are the teams and nodes that get a role and user of their own.
type Parties struct {
	Teams []string
	// Nodes get hyperpod-node-<node> (NodeRoleFor), one per node agent.
	Nodes []string
}

// BootstrapFleet is Bootstrap with node users too: one role and user per
// node (NodeRoleFor), password in <dir>/hyperpod-node-<node>.password.
func BootstrapFleet(ctx context.Context, cli *clientv3.Client, k fleet.Keys, p Parties, dir string) (*BootstrapResult, error) {
	roles := FleetRoles(k)
	for _, t := range p.Teams {
		r, err := TeamRoleFor(k, t)
		if err != nil {
			return nil, err
		}
		roles = append(roles, r)
	}
	for _, n := range p.Nodes {
		r, err := NodeRoleFor(k, n)
		if err != nil {
			return nil, err
		}
		roles = append(roles, r)
	}
	res, err := createUsers(ctx, cli, roles, true, dir)
	if err != nil {
		return nil, err
	}
	st, err := authStatus(ctx, cli)
	if errors.Is(err, errNoAuthStatus) {
		// etcd 3.4 has no AuthStatus; a client that logged in as a user
		// finds auth on (it could not have logged in otherwise).
		st, err = cli.Username != "", nil
	}
	if err != nil {
		return nil, err
	}
	if !st {
		if err := call(ctx, func(ctx context.Context) error { _, err := cli.AuthEnable(ctx); return err }); err != nil {
			return nil, fmt.Errorf("enable auth: %w", err)
		}
		res.Enabled = true
	}
	return res, nil
}

// AddNodes creates the role and user of each node (NodeRoleFor) on an etcd
// whose auth is on, as Bootstrap does for nodes added later: cli must be
// root's; existing users keep their passwords. It does not touch auth.
func AddNodes(ctx context.Context, cli *clientv3.Client, k fleet.Keys, nodes []string, dir string) (*BootstrapResult, error) {
	var roles []Role
	for _, n := range nodes {
		r, err := NodeRoleFor(k, n)
		if err != nil {
			return nil, err
		}
		roles = append(roles, r)
	}
	return createUsers(ctx, cli, roles, false, dir)
}

// createUsers creates roles and a user of each (and root's, with withRoot),
// writing new users' passwords under dir.
func createUsers(ctx context.Context, cli *clientv3.Client, roles []Role, withRoot bool, dir string) (*BootstrapResult, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("password directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("password directory: %w", err)
	}
	res := &BootstrapResult{Created: map[string]string{}}
	save := func(user, pw string) error {
		if pw == "" {
			res.Kept = append(res.Kept, user)
			return nil
		}
		p := filepath.Join(dir, user+".password")
		if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
			return fmt.Errorf("write %s's password: %w", user, err)
		}
		res.Created[user] = p
		return nil
	}
	for _, r := range roles {
		if err := ensureRole(ctx, cli, r); err != nil {
			return nil, err
		}
	}
	if withRoot {
		pw, err := ensureUser(ctx, cli, RootUser, "root")
		if err != nil {
			return nil, err
		}
		if err := save(RootUser, pw); err != nil {
			return nil, err
		}
	}
	users := map[string]string{AdminRole: AdminUser, CoordinatorRole: CoordinatorUser, AgentRole: AgentUser, KubeControllerRole: KubeControllerUser}
	for _, r := range roles {
		user, ok := users[r.Name]
		if !ok {
			user = r.Name // teams and nodes: the user is named as its role
		}
		grant := []string{r.Name}
		if r.Root {
			grant = append(grant, "root")
		}
		pw, err := ensureUser(ctx, cli, user, grant...)
		if err != nil {
			return nil, err
		}
		if err := save(user, pw); err != nil {
			return nil, err
		}
	}
	slices.Sort(res.Kept)
	return res, nil
}

func authStatus(ctx context.Context, cli *clientv3.Client) (bool, error) {
	var on bool
	err := call(ctx, func(ctx context.Context) error {
		r, err := cli.AuthStatus(ctx)
		if err == nil {
			on = r.Enabled
		}
		return err
	})
	if status.Code(err) == codes.Unimplemented {
		return false, errNoAuthStatus
	}
	if err != nil {
		return false, fmt.Errorf("read auth status: %w", err)
	}
	return on, nil
}

// errNoAuthStatus: the server predates the AuthStatus call (etcd 3.4).
var errNoAuthStatus = errors.New("this etcd does not report whether auth is on (etcd < 3.5)")

// AuthEnabled reports whether auth is on at the etcd cli talks to.
func AuthEnabled(ctx context.Context, cli *clientv3.Client) (bool, error) {
	return authStatus(ctx, cli)
}

// Mint creates job's role and user (JobRoleFor) with a fresh password and
// records them at creds/<job> for the node agents. Minting again rotates
// the password. cli must have etcd's root role.
func Mint(ctx context.Context, cli *clientv3.Client, k fleet.Keys, job string) (*fleet.JobCreds, error) {
	r, err := JobRoleFor(k, job)
	if err != nil {
		return nil, err
	}
	if err := ensureRole(ctx, cli, r); err != nil {
		return nil, err
	}
	pw, err := NewPassword()
	if err != nil {
		return nil, err
	}
	if err := setUser(ctx, cli, r.Name, pw); err != nil {
		return nil, fmt.Errorf("job %s's etcd user: %w", job, err)
	}
	c := &fleet.JobCreds{Job: job, User: r.Name, Password: pw}
	v, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.Put(ctx, k.Creds(job), string(v)); return err }); err != nil {
		return nil, fmt.Errorf("record job %s's credentials: %w", job, err)
	}
	return c, nil
}

// Revoke deletes job's user, role and credentials record (what exists of
// them). Its hyperpodruns' next etcd call fails authentication.
func Revoke(ctx context.Context, cli *clientv3.Client, k fleet.Keys, job string) error {
	if err := api.ValidateName("job", job); err != nil {
		return err
	}
	name := JobRole(job)
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.UserDelete(ctx, name); return err }); err != nil && !gone(err) {
		return fmt.Errorf("delete job %s's etcd user: %w", job, err)
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.RoleDelete(ctx, name); return err }); err != nil && !gone(err) {
		return fmt.Errorf("delete job %s's etcd role: %w", job, err)
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.Delete(ctx, k.Creds(job)); return err }); err != nil {
		return fmt.Errorf("delete job %s's credentials record: %w", job, err)
	}
	return nil
}

// HasJobUser reports whether job's etcd user exists (minted and not
// revoked).
func HasJobUser(ctx context.Context, cli *clientv3.Client, job string) (bool, error) {
	if err := api.ValidateName("job", job); err != nil {
		return false, err
	}
	err := call(ctx, func(ctx context.Context) error { _, err := cli.UserGet(ctx, JobRole(job)); return err })
	if gone(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read job %s's etcd user: %w", job, err)
	}
	return true, nil
}

// MintedJobs lists the jobs that have a user (for revoking those whose job
// is gone).
func MintedJobs(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	var users []string
	err := call(ctx, func(ctx context.Context) error {
		r, err := cli.UserList(ctx)
		if err == nil {
			users = r.Users
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list etcd users: %w", err)
	}
	var jobs []string
	for _, u := range users {
		if j, ok := IsJobRole(u); ok {
			jobs = append(jobs, j)
		}
	}
	return jobs, nil
}
