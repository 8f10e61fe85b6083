package etcdauth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestRolesAreLeastPrivilege(t *testing.T) {
	k := fleet.NewKeys("")
	team, err := TeamRoleFor(k, "research")
	if err != nil {
		t.Fatal(err)
	}
	job, err := JobRoleFor(k, "sweep")
	if err != nil {
		t.Fatal(err)
	}
	writes := func(r Role) []string {
		var out []string
		for _, p := range r.Perms {
			if p.Access != Read {
				out = append(out, p.Prefix+p.Key)
			}
		}
		return out
	}
	reads := func(r Role, key string) bool {
		for _, p := range r.Perms {
			if p.Key == key || (p.Prefix != "" && strings.HasPrefix(key, p.Prefix)) {
				return true
			}
		}
		return false
	}
	if got := writes(team); len(got) != 1 || got[0] != "/hyperpodrun/specs/research/" {
		t.Errorf("team role writes %v, want only its own specs prefix", got)
	}
	if got := writes(job); len(got) != 1 || got[0] != "/hyperpodrun/jobs/sweep/" {
		t.Errorf("job role writes %v, want only jobs/sweep/", got)
	}
	if reads(team, k.Creds("sweep")) {
		t.Error("a team may read another job's credentials")
	}
	if reads(job, k.Checkpoint("sweep2")) || reads(job, k.Spec("research", "sweep")) || reads(job, k.Creds("sweep")) {
		t.Error("a job may read beyond its own keys and desired record")
	}
	node, err := NodeRoleFor(k, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if !reads(node, k.Assignment("node-a", "sweep")) {
		t.Error("a node agent cannot read its own assignments, which carry the credentials it hands to jobs")
	}
	if reads(node, k.Creds("sweep")) || reads(node, k.Assignment("node-b", "sweep")) {
		t.Error("a node agent may read credentials of jobs not placed on it")
	}
	if _, err := TeamRoleFor(k, "../x"); err == nil {
		t.Error("a team name escaping its prefix was accepted")
	}
	if _, err := JobRoleFor(k, "a/b"); err == nil {
		t.Error("a job name escaping its prefix was accepted")
	}
}

// backends are the real etcds the auth tests run on: the embedded server
// and Debian's etcd 3.4 binary.
func backends(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"embedded": func(t *testing.T) string {
			srv, _ := etcdtest.Start(t)
			return srv.Endpoints[0]
		},
		"debian-etcd-3.4": func(t *testing.T) string {
			bin, ok := etcdtest.DebianEtcd()
			if !ok {
				t.Skipf("Debian's etcd is not installed at %s: apt-get install etcd-server (.ci/run does)", bin)
			}
			return etcdtest.StartBinary(t, bin)
		},
	}
}

func connectAs(t *testing.T, ep, user, pwFile string) (*clientv3.Client, error) {
	t.Helper()
	var pw string
	if pwFile != "" {
		b, err := os.ReadFile(pwFile)
		if err != nil {
			t.Fatal(err)
		}
		pw = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: []string{ep}, User: user, Password: pw})
	if err == nil {
		t.Cleanup(func() { cli.Close() })
	}
	return cli, err
}

func mustConnectAs(t *testing.T, ep, user, pwFile string) *clientv3.Client {
	t.Helper()
	cli, err := connectAs(t, ep, user, pwFile)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	return cli
}

func spec(name, team string) fleet.JobSpec {
	return fleet.JobSpec{Job: api.Job{Name: name, Team: team, Flavor: "cpu", PerNode: api.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 2, Elastic: true},
		Run: fleet.RunSpec{Script: "train.py"}}
}

// Each attack of issue 11 that etcd's auth must stop, against a real etcd
// with auth on: another team's job, another job's keys, the credentials.
func TestAuthOnRealEtcdRefusesWhatARoleDoesNotOwn(t *testing.T) {
	for name, start := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ep := start(t)
			k := fleet.NewKeys("")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			open := mustConnectAs(t, ep, "", "")
			dir := filepath.Join(t.TempDir(), "passwords")
			res, err := Bootstrap(ctx, open, k, []string{"team-a", "team-b"}, dir)
			if err != nil {
				t.Fatalf("bootstrap: %v", err)
			}
			if !res.Enabled {
				t.Fatal("bootstrap did not turn auth on")
			}
			for user, p := range res.Created {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s's password file %s: %v, mode %v; want 0600", user, p, err, fi.Mode().Perm())
				}
			}
			pw := func(user string) string { return filepath.Join(dir, user+".password") }
			// Auth is on: no user, no access.
			if _, err := open.Get(ctx, k.TeamsPrefix(), clientv3.WithPrefix()); err == nil {
				t.Fatal("an anonymous client still reads the fleet after bootstrap")
			}
			// Bootstrap again changes nothing and keeps the passwords.
			root := mustConnectAs(t, ep, RootUser, pw(RootUser))
			again, err := Bootstrap(ctx, root, k, []string{"team-a", "team-b"}, dir)
			if err != nil || len(again.Created) != 0 || again.Enabled {
				t.Fatalf("second bootstrap = %+v, %v; want nothing created", again, err)
			}

			admin := fleet.New(mustConnectAs(t, ep, AdminUser, pw(AdminUser)), "")
			for _, team := range []string{"team-a", "team-b"} {
				if err := admin.PutTeam(ctx, api.Team{Name: team}); err != nil {
					t.Fatalf("admin writes team %s: %v", team, err)
				}
			}
			a := fleet.New(mustConnectAs(t, ep, TeamRole("team-a"), pw(TeamRole("team-a"))), "")
			b := fleet.New(mustConnectAs(t, ep, TeamRole("team-b"), pw(TeamRole("team-b"))), "")
			if err := a.SubmitJob(ctx, spec("a-job", "team-a")); err != nil {
				t.Fatalf("team a submits its own job: %v", err)
			}
			if err := b.SubmitJob(ctx, spec("b-job", "team-b")); err != nil {
				t.Fatalf("team b submits its own job: %v", err)
			}
			// Team a resizes team b's job.
			_, err = a.UpdateJob(ctx, "b-job", func(j *fleet.JobSpec) error { j.MaxNodes = 1; return nil })
			if !fleet.IsPermissionDenied(err) {
				t.Errorf("team a resizing team b's job = %v, want permission denied", err)
			}
			if err := a.DeleteJob(ctx, "b-job"); !fleet.IsPermissionDenied(err) {
				t.Errorf("team a deleting team b's job = %v, want permission denied", err)
			}
			if err := a.SubmitJob(ctx, spec("x", "team-b")); !fleet.IsPermissionDenied(errors.Unwrap(err)) && !fleet.IsPermissionDenied(err) {
				t.Errorf("team a submitting into team b = %v, want permission denied", err)
			}
			if j, err := b.Job(ctx, "b-job"); err != nil || j.MaxNodes != 2 {
				t.Errorf("team b's job after the attacks: %+v, %v; want it unchanged", j, err)
			}
			// A team writes the fleet's teams and quotas.
			if err := a.PutTeam(ctx, api.Team{Name: "team-a", Quotas: []api.FlavorQuota{{Flavor: "cpu", Nominal: 1000}}}); !fleet.IsPermissionDenied(err) {
				t.Errorf("team a raising its own quota = %v, want permission denied", err)
			}
			// A team's own resize works.
			if _, err := a.UpdateJob(ctx, "a-job", func(j *fleet.JobSpec) error { j.MaxNodes = 1; return nil }); err != nil {
				t.Errorf("team a resizes its own job: %v", err)
			}

			// The coordinator mints a job's credentials.
			coord := mustConnectAs(t, ep, CoordinatorUser, pw(CoordinatorUser))
			creds, err := Mint(ctx, coord, k, "a-job")
			if err != nil {
				t.Fatalf("mint: %v", err)
			}
			if _, err := Mint(ctx, coord, k, "b-job"); err != nil {
				t.Fatalf("mint: %v", err)
			}
			if _, err := a.Creds(ctx, "a-job"); !fleet.IsPermissionDenied(err) {
				t.Errorf("a team reads job credentials: %v, want permission denied", err)
			}
			// Only the coordinator (and the kube controller, below) read creds/:
			// a node agent gets a job's credentials in its assignment.
			agent := fleet.New(coord, "")
			if got, err := agent.Creds(ctx, "a-job"); err != nil || got.Password != creds.Password {
				t.Fatalf("the coordinator reads the job's credentials: %+v, %v", got, err)
			}
			pwFile := filepath.Join(t.TempDir(), "job.password")
			os.WriteFile(pwFile, []byte(creds.Password), 0o600)
			job := mustConnectAs(t, ep, creds.User, pwFile)
			if _, err := job.Put(ctx, k.Checkpoint("a-job"), `{"step":1,"path":"/c/1"}`); err != nil {
				t.Errorf("the job writes its own checkpoint record: %v", err)
			}
			if _, err := job.Get(ctx, k.Desired("a-job")); err != nil {
				t.Errorf("the job reads its desired record: %v", err)
			}
			// A job's hyperpodrun writes another job's keys.
			for _, key := range []string{k.Checkpoint("b-job"), k.Rdzv("b-job").Head, k.Spec("team-a", "a-job"), k.Desired("a-job"), k.Finish("b-job")} {
				if _, err := job.Put(ctx, key, "x"); !fleet.IsPermissionDenied(err) {
					t.Errorf("job a-job writing %s = %v, want permission denied", key, err)
				}
			}
			if _, err := job.Get(ctx, k.Creds("b-job")); !fleet.IsPermissionDenied(err) {
				t.Errorf("job a-job reading b-job's credentials = %v, want permission denied", err)
			}
			if r, err := agent.Cli.Get(ctx, k.Checkpoint("b-job")); err != nil || len(r.Kvs) != 0 {
				t.Errorf("b-job's checkpoint record after the attack: %v, %v", r, err)
			}

			// The Kubernetes controller does what its bridge does and
			// nothing the coordinator alone may.
			ctlCli := mustConnectAs(t, ep, KubeControllerUser, pw(KubeControllerUser))
			ctl := fleet.New(ctlCli, "")
			wch := ctlCli.Watch(clientv3.WithRequireLeader(ctx), k.Root(), clientv3.WithPrefix())
			if err := ctl.PutTeam(ctx, api.Team{Name: "team-c"}); err != nil {
				t.Errorf("the controller applies an ElasticTeam: %v", err)
			}
			if err := ctl.SubmitJob(ctx, spec("k-job", "team-b")); err != nil {
				t.Errorf("the controller submits an ElasticJob of team b: %v", err)
			}
			lease, err := ctlCli.Grant(ctx, 30)
			if err != nil {
				t.Fatalf("the controller grants its node lease: %v", err)
			}
			op, err := ctl.PutNodeOp(api.Inventory{Node: "kn1", Flavor: "cpu", State: api.StateReady}, clientv3.WithLease(lease.ID))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ctlCli.Do(ctx, op); err != nil {
				t.Errorf("the controller writes a Kubernetes Node's record: %v", err)
			}
			if err := ctl.RecordFinish(ctx, "k-job", fleet.Finish{Outcome: fleet.Succeeded, Node: "kn1", Time: time.Now()}); err != nil {
				t.Errorf("the controller writes a finish record: %v", err)
			}
			if got, err := ctl.Creds(ctx, "b-job"); err != nil || got == nil || got.User != JobRole("b-job") {
				t.Errorf("the controller reads the credentials it puts in a Secret: %+v, %v", got, err)
			}
			select {
			case w := <-wch:
				if w.Err() != nil || len(w.Events) == 0 {
					t.Errorf("the controller's watch of the whole tree: %v", w.Err())
				}
			case <-ctx.Done():
				t.Error("the controller's watch of the whole tree saw nothing")
			}
			for _, key := range []string{k.Desired("b-job"), k.Status("b-job"), k.Assignment("kn1", "b-job"), k.Creds("k-job"),
				k.Checkpoint("b-job"), k.Event(time.Now(), "b-job")} {
				if _, err := ctlCli.Put(ctx, key, "x"); !fleet.IsPermissionDenied(err) {
					t.Errorf("the controller writing %s = %v, want permission denied", key, err)
				}
			}
			if _, err := Mint(ctx, ctlCli, k, "k-job"); err == nil {
				t.Error("the controller minted a job's etcd user; only the coordinator (root) may")
			}

			// Revoked when the job ends: the job's user is gone.
			if err := Revoke(ctx, coord, k, "a-job"); err != nil {
				t.Fatalf("revoke: %v", err)
			}
			if _, err := connectAs(t, ep, creds.User, pwFile); err == nil {
				t.Error("a revoked job's credentials still authenticate")
			}
			if c, err := agent.Creds(ctx, "a-job"); err != nil || c != nil {
				t.Errorf("a revoked job's credentials record: %+v, %v; want none", c, err)
			}
			if jobs, err := MintedJobs(ctx, coord); err != nil || len(jobs) != 1 || jobs[0] != "b-job" {
				t.Errorf("minted jobs after revoking a-job = %v, %v; want [b-job]", jobs, err)
			}
		})
	}
}

// docs/security.md shows the roles the code grants.
func TestSecurityDocListsTheRoles(t *testing.T) {
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := Table(fleet.NewKeys("")); !strings.Contains(string(b), want) {
		t.Errorf("docs/security.md's role table is out of date; want:\n%s", want)
	}
}

// Issue 22: one node's etcd user speaks for its own node only. node-a's
// agent cannot read a job's credentials (creds/) nor the assignment (and
// so the credentials) of a job on node-b, cannot fail a job (finished/),
// register node-b, report for node-b or read its liveness key; it can do
// all of that for itself. A team reads no job's rendezvous keys (their
// lease ids are the job's), and a re-bootstrap takes away what an
// earlier release's roles granted beyond today's.
func TestNodeUsersSpeakOnlyForTheirOwnNode(t *testing.T) {
	for name, start := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ep := start(t)
			k := fleet.NewKeys("")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			open := mustConnectAs(t, ep, "", "")
			// An earlier release's team role read jobs/: a re-bootstrap
			// must take that away.
			if _, err := open.RoleAdd(ctx, TeamRole("team-b")); err != nil {
				t.Fatal(err)
			}
			if _, err := open.RoleGrantPermission(ctx, TeamRole("team-b"), k.JobsPrefix(), clientv3.GetPrefixRangeEnd(k.JobsPrefix()), clientv3.PermissionType(clientv3.PermRead)); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "pw")
			res, err := BootstrapFleet(ctx, open, k, Parties{Teams: []string{"team-a", "team-b"}, Nodes: []string{"node-a", "node-b"}}, dir)
			if err != nil {
				t.Fatalf("bootstrap: %v", err)
			}
			for _, u := range []string{NodeRole("node-a"), NodeRole("node-b")} {
				if p := res.Created[u]; p != filepath.Join(dir, u+".password") {
					t.Errorf("node user %s: password file %q", u, p)
				}
			}
			pw := func(user string) string { return filepath.Join(dir, user+".password") }
			root := mustConnectAs(t, ep, RootUser, pw(RootUser))
			rst := fleet.New(root, "")
			for _, job := range []string{"a-job", "b-job"} {
				if err := rst.SubmitJob(ctx, spec(job, "team-a")); err != nil {
					t.Fatal(err)
				}
			}
			creds, err := Mint(ctx, root, k, "b-job")
			if err != nil {
				t.Fatal(err)
			}
			// b-job is placed on node-b, a-job on node-a, each with its
			// credentials in its assignment, as the coordinator writes them.
			for _, p := range []struct{ node, job string }{{"node-a", "a-job"}, {"node-b", "b-job"}} {
				op, err := rst.PutAssignmentRecordOp(p.node, fleet.Assignment{Job: p.job, Generation: 1, UID: 200000, Creds: &fleet.JobCreds{Job: p.job, User: JobRole(p.job), Password: "pw-" + p.job}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := root.Do(ctx, op); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := root.Put(ctx, k.Rdzv("b-job").Member("node-b"), `{"lease":1}`); err != nil {
				t.Fatal(err)
			}

			aCli := mustConnectAs(t, ep, NodeRole("node-a"), pw(NodeRole("node-a")))
			a := fleet.New(aCli, "")
			// What node-a may do for itself.
			lease, err := aCli.Grant(ctx, 30)
			if err != nil {
				t.Fatal(err)
			}
			op, err := a.PutNodeOp(api.Inventory{Node: "node-a", Flavor: "cpu", State: api.StateReady}, clientv3.WithLease(lease.ID))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := aCli.Do(ctx, op); err != nil {
				t.Errorf("node-a registers itself: %v", err)
			}
			if _, err := aCli.Put(ctx, k.Alive("node-a"), "1", clientv3.WithLease(lease.ID)); err != nil {
				t.Errorf("node-a writes its liveness key: %v", err)
			}
			if c, err := a.NodeCreds(ctx, "node-a", "a-job"); err != nil || c == nil || c.Password != "pw-a-job" {
				t.Errorf("node-a reads the credentials of its own job: %+v, %v", c, err)
			}
			if err := a.MarkFinished(ctx, "a-job", fleet.Finish{Outcome: fleet.Failed, Node: "node-a", Time: time.Now()}); err != nil {
				t.Errorf("node-a reports its job's finish: %v", err)
			}
			if err := a.PutProblem(ctx, fleet.Problem{Job: "a-job", Node: "node-a", Message: "containerd is down", Time: time.Now()}); err != nil {
				t.Errorf("node-a reports a problem: %v", err)
			}
			// Not even its own job's rendezvous keys (their lease ids are
			// the job's): its runner reads them as the job.
			if _, _, err := a.Restarts(ctx, "a-job"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads a-job's restart count as itself = %v, want permission denied (the runner reads it as the job)", err)
			}
			if _, _, err := a.Finished(ctx); err != nil {
				t.Errorf("node-a reads the finish records: %v", err)
			}
			// What node-a may not do: read credentials of a job not on it.
			if _, err := a.Creds(ctx, "b-job"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads creds/b-job = %v, want permission denied", err)
			}
			if c, err := a.NodeCreds(ctx, "node-b", "b-job"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads b-job's assignment on node-b = %+v, %v; want permission denied", c, err)
			}
			if _, err := aCli.Get(ctx, k.AssignPrefix(), clientv3.WithPrefix()); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a lists every assignment = %v, want permission denied", err)
			}
			// Fail a job on node-b, register node-b, speak for node-b.
			if err := a.RecordFinish(ctx, "b-job", fleet.Finish{Outcome: fleet.Failed, Node: "node-b"}); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a writes finished/b-job = %v, want permission denied", err)
			}
			op, err = a.PutNodeOp(api.Inventory{Node: "node-b", Flavor: "cpu", State: api.StateReady}, clientv3.WithLease(lease.ID))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := aCli.Do(ctx, op); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a registers node-b = %v, want permission denied", err)
			}
			for _, key := range []string{k.Alive("node-b"), k.FinishReport("node-b", "b-job"), k.ProblemReport("node-b", "b-job"),
				k.Problem("b-job", "node-a"), k.Creds("a-job"), k.Assignment("node-a", "b-job"), k.Desired("b-job")} {
				if _, err := aCli.Put(ctx, key, "x"); !fleet.IsPermissionDenied(err) {
					t.Errorf("node-a writes %s = %v, want permission denied", key, err)
				}
			}
			if err := a.MarkFinished(ctx, "b-job", fleet.Finish{Outcome: fleet.Failed, Node: "node-b"}); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reports b-job's finish as node-b = %v, want permission denied", err)
			}
			if _, err := aCli.Get(ctx, k.Alive("node-b")); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads node-b's liveness key = %v, want permission denied", err)
			}
			if r, err := root.Get(ctx, k.Finish("b-job")); err != nil || len(r.Kvs) != 0 {
				t.Errorf("b-job's finish record after node-a's attempts: %v, %v", r, err)
			}
			if r, err := root.Get(ctx, k.Node("node-b")); err != nil || len(r.Kvs) != 0 {
				t.Errorf("node-b's record after node-a's attempts: %v, %v", r, err)
			}

			// A team reads no job's rendezvous keys (lease ids), nor
			// does the admin; the job itself does.
			for _, user := range []string{TeamRole("team-a"), TeamRole("team-b"), AdminUser, NodeRole("node-a"), NodeRole("node-b")} {
				c := mustConnectAs(t, ep, user, pw(user))
				if _, err := c.Get(ctx, k.Rdzv("b-job").Member("node-b")); !fleet.IsPermissionDenied(err) {
					t.Errorf("%s reads b-job's rendezvous member record = %v, want permission denied", user, err)
				}
				if _, err := c.Get(ctx, k.JobsPrefix(), clientv3.WithPrefix()); !fleet.IsPermissionDenied(err) {
					t.Errorf("%s lists jobs/ = %v, want permission denied", user, err)
				}
			}
			jobPW := filepath.Join(t.TempDir(), "job.password")
			os.WriteFile(jobPW, []byte(creds.Password), 0o600)
			if _, err := mustConnectAs(t, ep, creds.User, jobPW).Get(ctx, k.Rdzv("b-job").Member("node-b")); err != nil {
				t.Errorf("b-job reads its own rendezvous: %v", err)
			}
			// A team still submits a job once an earlier namesake is
			// forgotten, and is told when one is still leaving.
			team := fleet.New(mustConnectAs(t, ep, TeamRole("team-a"), pw(TeamRole("team-a"))), "")
			if err := team.SubmitJob(ctx, spec("c-job", "team-a")); err != nil {
				t.Errorf("a team submits a job: %v", err)
			}
			if err := rst.SetTarget(ctx, "d-job", 1); err != nil {
				t.Fatal(err)
			}
			if err := team.SubmitJobs(ctx, []fleet.JobSpec{spec("d-job", "team-a")}); err == nil || !strings.Contains(err.Error(), "still leaving") {
				t.Errorf("a team submits a job whose namesake still holds a desired record: %v, want 'still leaving'", err)
			}

			// A node added later gets its user from root.
			added, err := AddNodes(ctx, root, k, []string{"node-c"}, dir)
			if err != nil || added.Created[NodeRole("node-c")] == "" {
				t.Fatalf("add node-c: %+v, %v", added, err)
			}
			cCli := mustConnectAs(t, ep, NodeRole("node-c"), pw(NodeRole("node-c")))
			if _, err := cCli.Put(ctx, k.Alive("node-c"), "1"); err != nil {
				t.Errorf("node-c writes its liveness key: %v", err)
			}
			if _, err := cCli.Put(ctx, k.Alive("node-a"), "1"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-c writes node-a's liveness key = %v, want permission denied", err)
			}
			if _, err := AddNodes(ctx, root, k, []string{"a/b"}, dir); err == nil {
				t.Error("a node name escaping its prefix was accepted")
			}
		})
	}
}
