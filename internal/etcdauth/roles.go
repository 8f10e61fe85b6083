// Package etcdauth is who may do what in etcd: the roles of the fleet
// (docs/security.md) as a pure function of the key layout, the bootstrap
// that creates them with their users on an etcd and turns auth on, and the
// per-job credentials the coordinator mints when it admits a job and
// revokes when the job ends. etcd's own auth (users, roles, key-range
// permissions) is the mechanism; nothing here checks a permission itself.
package etcdauth

import (
	"fmt"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Access is a permission's kind, as etcd's.
type Access string

// Kinds of access.
const (
	Read      Access = "read"
	Write     Access = "write"
	ReadWrite Access = "readwrite"
)

// Perm grants Access to the keys under Prefix (or to the one key Key).
type Perm struct {
	// Prefix is a key prefix (every key that starts with it); empty when
	// Key is set.
	Prefix string
	// Key is one exact key; empty when Prefix is set.
	Key    string
	Access Access
}

// Role is an etcd role and its permissions.
type Role struct {
	Name  string
	Perms []Perm
	// Root says the role's user also gets etcd's root role: etcd allows
	// only root to manage users and roles, which minting per-job
	// credentials needs.
	Root bool
	// Doc says what the role is for (docs/security.md).
	Doc string
}

// Role names.
const (
	AdminRole       = "hyperpod-admin"
	CoordinatorRole = "hyperpod-coordinator"
	AgentRole       = "hyperpod-agent"
	// KubeControllerRole is hyperpod-kube-controller's: the bridge between
	// ElasticJob resources and the fleet's records.
	KubeControllerRole = "hyperpod-kube-controller"
	// EnrollRole (and user) is the shared, nearly powerless identity of
	// every agent pod of the Kubernetes DaemonSet before it has its own
	// node's user: it may ask to enroll (enroll/) and read the sealed
	// replies (enroll-replies/), nothing else.
	EnrollRole     = "hyperpod-enroll"
	teamRolePrefix = "hyperpod-team-"
	jobRolePrefix  = "hyperpod-job-"
	nodeRolePrefix = "hyperpod-node-"
)

// NodeRole is the role (and user) name of one node's agent.
func NodeRole(node string) string { return nodeRolePrefix + node }

// TeamRole is the role (and user) name of a team.
func TeamRole(team string) string { return teamRolePrefix + team }

// JobRole is the role (and user) name of a running job.
func JobRole(job string) string { return jobRolePrefix + job }

// IsJobRole reports whether name is a job's role, and which job's.
func IsJobRole(name string) (string, bool) {
	job, ok := strings.CutPrefix(name, jobRolePrefix)
	return job, ok && job != ""
}

// public are the prefixes every party may read: what elasticctl shows.
// Not creds/ (other jobs' passwords), not jobs/ (a job's rendezvous keys
// carry its nodes' lease ids, which are the job's own), not assign/ (an
// assignment carries the job's credentials for its node), not alive/ nor
// reports/ (a node's own).
func public(k fleet.Keys) []Perm {
	var ps []Perm
	for _, p := range []string{k.TeamsPrefix(), k.SpecsPrefix(), k.DesiredPrefix(), k.StatusPrefix(), k.EventsPrefix(),
		k.NodesPrefix(), k.FinishedPrefix(), k.ProblemsPrefix(), k.CoordinatorPrefix()} {
		ps = append(ps, Perm{Prefix: p, Access: Read})
	}
	return ps
}

// merge drops repeated ranges, keeping the widest access: etcd replaces a
// range's permission when it is granted again, so a read grant after a
// readwrite one of the same range would take the write away.
func merge(ps []Perm) []Perm {
	var out []Perm
	at := map[[2]string]int{}
	for _, p := range ps {
		k := [2]string{p.Prefix, p.Key}
		if i, ok := at[k]; ok {
			if out[i].Access != p.Access {
				out[i].Access = ReadWrite
			}
			continue
		}
		at[k] = len(out)
		out = append(out, p)
	}
	return out
}

// FleetRoles are the roles every fleet has: admin, coordinator, node agent,
// the Kubernetes controller and the agent pods' enrollment.
func FleetRoles(k fleet.Keys) []Role {
	return []Role{
		{
			Name: AdminRole,
			Doc:  "platform admins: teams and quotas (elasticctl apply -f teams.yaml); reads everything users see",
			Perms: merge(append([]Perm{
				{Prefix: k.TeamsPrefix(), Access: ReadWrite},
			}, public(k)...)),
		},
		{
			Name: CoordinatorRole,
			Root: true,
			Doc:  "hyperpod-coordinator: decides every job's size and writes desired, status, events and usage; mints and revokes per-job credentials, which etcd allows only its root role",
			Perms: []Perm{
				{Prefix: k.Root(), Access: ReadWrite},
			},
		},
		{
			// One role for every node: it cannot tell node A from node
			// B, so any node holding it can speak for every other. Kept
			// for fleets that hand one Secret to a DaemonSet; per-node
			// users (NodeRoleFor) are the recommended setup.
			Name: AgentRole,
			Doc:  "hyperpod-agent shared by every node (legacy, e.g. one Secret for a DaemonSet; per-node users are recommended): node records under its lease, liveness keys and reports of any node, every node's assignments (and so the credentials of every placed job); never creds/, jobs/, finished/ or problems/ directly",
			Perms: merge(append([]Perm{
				{Prefix: k.NodesPrefix(), Access: ReadWrite},
				{Prefix: k.AlivePrefix(), Access: ReadWrite},
				{Prefix: k.ReportsPrefix(), Access: ReadWrite},
				{Prefix: k.AssignPrefix(), Access: Read},
			}, public(k)...)),
		},
		{
			// Not root and no decision of the coordinator's: it cannot
			// write desired, status, events, assignments, credentials or
			// any job's rendezvous, nor manage users. It reads the whole
			// tree because it watches it in one watch (etcd checks a
			// watch's whole range), which includes the credentials it
			// hands to pods as Secrets, as the node agent does, and every
			// alive key's lease id: it is as trusted as the coordinator.
			// It writes alive/ for the Nodes it bridges (alive keys under
			// its own secret lease, as a node agent does for its node).
			Name: KubeControllerRole,
			Doc:  "hyperpod-kube-controller: ElasticJobs to job specs of every team, ElasticTeams to team records, Kubernetes Nodes to node records and their alive keys (under its leases), finish records; judges agent pods' enrollment requests and writes the approvals; reads the rest, credentials and alive keys included, for pods' Secrets",
			Perms: []Perm{
				{Prefix: k.SpecsPrefix(), Access: ReadWrite},
				{Prefix: k.TeamsPrefix(), Access: ReadWrite},
				{Prefix: k.NodesPrefix(), Access: ReadWrite},
				{Prefix: k.AlivePrefix(), Access: ReadWrite},
				{Prefix: k.FinishedPrefix(), Access: ReadWrite},
				{Prefix: k.EnrollPrefix(), Access: ReadWrite},
				{Prefix: k.EnrollApprovedPrefix(), Access: ReadWrite},
				{Prefix: k.Root(), Access: Read},
			},
		},
		{
			// What one Secret shared by every agent pod may hold: a pod
			// asks for its node's user with its pod-bound ServiceAccount
			// token, and the reply is sealed to the key it made. It reads
			// no request (their tokens), no approval, no record.
			Name: EnrollRole,
			Doc:  "every hyperpod-agent pod before enrollment (docs/kubernetes.md): writes enrollment requests, reads the sealed replies; nothing else",
			Perms: []Perm{
				{Prefix: k.EnrollPrefix(), Access: Write},
				{Prefix: k.EnrollRepliesPrefix(), Access: Read},
			},
		},
	}
}

// TeamRoleFor is a team's role: submit, resize, suspend and delete its own
// jobs (its spec prefix), read what elasticctl shows of the rest.
func TeamRoleFor(k fleet.Keys, team string) (Role, error) {
	if err := api.ValidateName("team", team); err != nil {
		return Role{}, err
	}
	return Role{
		Name:  TeamRole(team),
		Doc:   fmt.Sprintf("team %s: submit, resize, suspend and delete its own jobs (%s); read the rest", team, k.TeamSpecs(team)),
		Perms: merge(append([]Perm{{Prefix: k.TeamSpecs(team), Access: ReadWrite}}, public(k)...)),
	}, nil
}

// NodeRoleFor is one node's agent's role: its own node record, liveness
// key and reports (exact keys and its own prefix), its own assignments to
// read (they carry the credentials of the jobs placed on it), and what
// elasticctl shows. Not jobs/: the members' lease ids there are the jobs'
// secrets; the runner reads a placed job's restart count and members as
// the job, with its credentials. Not creds/, not another node's
// assignments, not finished/ or problems/ to write: the coordinator copies
// a node's report there only when the job is placed on that node.
func NodeRoleFor(k fleet.Keys, node string) (Role, error) {
	if err := api.ValidateNodeName(node); err != nil {
		return Role{}, err
	}
	return Role{
		Name: NodeRole(node),
		Doc:  fmt.Sprintf("node %s's hyperpod-agent: its own node record, liveness key and reports; its own assignments (with the credentials of the jobs placed on it); read the rest", node),
		Perms: merge(append([]Perm{
			{Key: k.Node(node), Access: ReadWrite},
			{Key: k.Alive(node), Access: ReadWrite},
			{Prefix: k.NodeReports(node), Access: ReadWrite},
			{Prefix: k.NodeAssignments(node), Access: Read},
		}, public(k)...)),
	}, nil
}

// JobRoleFor is a running job's role: its own rendezvous, restart count,
// checkpoint record and barriers (jobs/<job>/), and its desired record to
// read. Nothing of any other job.
func JobRoleFor(k fleet.Keys, job string) (Role, error) {
	if err := api.ValidateName("job", job); err != nil {
		return Role{}, err
	}
	return Role{
		Name: JobRole(job),
		Doc:  fmt.Sprintf("job %s's hyperpodruns: its own rendezvous and checkpoint keys only", job),
		Perms: []Perm{
			{Prefix: k.Job(job), Access: ReadWrite},
			{Key: k.Desired(job), Access: Read},
		},
	}, nil
}

// Table renders the roles as docs/security.md's permission table (a test
// keeps the two in step): one row per role, with what it may write and
// read, for a team named <team> and a job named <job>.
func Table(k fleet.Keys) string {
	team, _ := TeamRoleFor(k, "team")
	job, _ := JobRoleFor(k, "job")
	node, _ := NodeRoleFor(k, "node")
	team.Name, job.Name, node.Name = TeamRole("<team>"), JobRole("<job>"), NodeRole("<node>")
	fix := func(s string) string {
		s = strings.ReplaceAll(s, k.TeamSpecs("team"), k.TeamSpecs("<team>"))
		for _, p := range [][2]string{{k.Node("node"), k.Node("<node>")}, {k.Alive("node"), k.Alive("<node>")},
			{k.NodeReports("node"), k.NodeReports("<node>")}, {k.NodeAssignments("node"), k.NodeAssignments("<node>")}} {
			if s == p[0] {
				return p[1]
			}
		}
		return strings.ReplaceAll(strings.ReplaceAll(s, k.Job("job"), k.Job("<job>")), k.Desired("job"), k.Desired("<job>"))
	}
	var b strings.Builder
	b.WriteString("| role (user) | writes | reads | etcd root |\n| --- | --- | --- | --- |\n")
	for _, r := range append(FleetRoles(k), node, team, job) {
		var w, rd []string
		for _, p := range r.Perms {
			key := "`" + fix(p.Prefix+p.Key) + "`"
			if p.Prefix != "" {
				key = "`" + fix(p.Prefix) + "*`"
			}
			if p.Access != Read {
				w = append(w, key)
			}
			if p.Access != Write {
				rd = append(rd, key)
			}
		}
		root := "no"
		if r.Root {
			root = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Name, strings.Join(w, " "), strings.Join(rd, " "), root)
	}
	return b.String()
}
