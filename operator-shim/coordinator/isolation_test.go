package coordinator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// authFleet is a real etcd with auth on (bootstrapped with users for team
// a and nodes node-a and node-b), node-a a CPU node and node-b a trainium2
// node, each registered by its own node user, and a running coordinator
// minting job credentials and handing out uids.
type authFleet struct {
	ctx   context.Context
	eps   []string
	dir   string
	root  *fleet.Store
	team  *fleet.Store
	nodes map[string]*fleet.Store
}

func (f *authFleet) as(t *testing.T, user string) *clientv3.Client {
	t.Helper()
	pw, err := etcdconn.ReadPassword(filepath.Join(f.dir, user+".password"), "", "test")
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcdconn.Connect(f.ctx, etcdconn.Options{Endpoints: f.eps, User: user, Password: pw})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// authBackends are the real etcds: embedded, and Debian's etcd 3.4.
func authBackends() map[string]func(t *testing.T) []string {
	return map[string]func(t *testing.T) []string{
		"embedded": func(t *testing.T) []string {
			srv, _ := etcdtest.Start(t)
			return srv.Endpoints
		},
		"debian-etcd-3.4": func(t *testing.T) []string {
			bin, ok := etcdtest.DebianEtcd()
			if !ok {
				t.Skipf("Debian's etcd is not installed at %s: apt-get install etcd-server", bin)
			}
			return []string{etcdtest.StartBinary(t, bin)}
		},
	}
}

func startAuthFleet(t *testing.T, eps []string, cfg Config) *authFleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	open, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	f := &authFleet{ctx: ctx, eps: eps, dir: filepath.Join(t.TempDir(), "pw"), nodes: map[string]*fleet.Store{}}
	if _, err := etcdauth.BootstrapFleet(ctx, open, fleet.NewKeys(""), etcdauth.Parties{Teams: []string{"a"}, Nodes: []string{"node-a", "node-b"}}, f.dir); err != nil {
		t.Fatal(err)
	}
	f.root = fleet.New(f.as(t, etcdauth.RootUser), "")
	if err := fleet.New(f.as(t, etcdauth.AdminUser), "").PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{
		{Flavor: "trainium2", Nominal: 64}, {Flavor: devices.FlavorCPU, Nominal: 8}}}); err != nil {
		t.Fatal(err)
	}
	f.team = fleet.New(f.as(t, etcdauth.TeamRole("a")), "")
	for _, n := range []string{"node-a", "node-b"} {
		cli := f.as(t, etcdauth.NodeRole(n))
		inv := devices.Inventory{Node: n, Flavor: devices.FlavorCPU, VCPUs: 8, State: devices.StateReady}
		if n == "node-b" {
			inv.Flavor = "trainium2"
			for d := 0; d < 16; d++ {
				inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: "trainium2", Healthy: true})
			}
		}
		etcdtest.RegisterNode(t, cli, inv) // as the node's own user
		f.nodes[n] = fleet.New(cli, "")
	}
	cfg.Identity, cfg.JobCredentials = "c", true
	cfg.Engine = policy.Config{MinStablePeriod: -1}
	if cfg.Resync == 0 {
		cfg.Resync = time.Hour // no cycle but those the watches cause
	}
	c := New(f.as(t, etcdauth.CoordinatorUser), cfg)
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	t.Cleanup(func() { ccancel(); <-done })
	return f
}

// eventually polls cond every 20ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testutil.Eventually(t, within, what, cond)
}

func placedOn(t *testing.T, f *authFleet, job string) *fleet.Desired {
	var d *fleet.Desired
	eventually(t, 20*time.Second, job+" placed", func() (bool, string) {
		var err error
		d, err = f.root.Desired(f.ctx, job)
		return err == nil && d.Running(), fmt.Sprintf("%+v %v", d, err)
	})
	return d
}

// Issue 22: a node speaks only for itself. node-a's report that a job
// placed on node-b failed is ignored by the coordinator (the job keeps
// running), node-a cannot write the finish record itself nor read the
// job's credentials; node-b's own report ends the job as before. The job's
// credentials and uid reach node-b in its assignment.
func TestReportsOfANodeCountOnlyForJobsPlacedOnIt(t *testing.T) {
	for name, start := range authBackends() {
		t.Run(name, func(t *testing.T) {
			f := startAuthFleet(t, start(t), Config{JobUIDFirst: 200000, JobUIDLast: 200009})
			ctx, k := f.ctx, f.root.Keys
			on := func(job, flavor string, accel int) fleet.JobSpec {
				return fleet.JobSpec{Job: policy.Job{Name: job, Team: "a", Flavor: flavor, PerNode: policy.Resources{Accelerators: accel}, MinNodes: 1, MaxNodes: 1},
					Run: fleet.RunSpec{Script: "train.py"}}
			}
			if err := f.team.SubmitJob(ctx, on("on-b", "trainium2", 16)); err != nil {
				t.Fatal(err)
			}
			if err := f.team.SubmitJob(ctx, on("on-a", devices.FlavorCPU, 1)); err != nil {
				t.Fatal(err)
			}
			db, da := placedOn(t, f, "on-b"), placedOn(t, f, "on-a")
			if len(db.Nodes) != 1 || db.Nodes[0] != "node-b" || len(da.Nodes) != 1 || da.Nodes[0] != "node-a" {
				t.Fatalf("placements: on-b %v, on-a %v", db.Nodes, da.Nodes)
			}
			if db.UID < 200000 || db.UID > 200009 || da.UID < 200000 || da.UID > 200009 || db.UID == da.UID {
				t.Errorf("uids: on-b %d, on-a %d; want two different uids of 200000-200009", db.UID, da.UID)
			}
			// node-b gets on-b's credentials and uid in its assignment.
			var creds *fleet.JobCreds
			eventually(t, 10*time.Second, "on-b's credentials in its assignment", func() (bool, string) {
				var err error
				creds, err = f.nodes["node-b"].NodeCreds(ctx, "node-b", "on-b")
				return err == nil && creds != nil && creds.User == etcdauth.JobRole("on-b"), fmt.Sprintf("%+v %v", creds, err)
			})
			as, _, _, err := f.nodes["node-b"].Assignments(ctx, "node-b")
			if err != nil || len(as) != 1 || as[0].UID != db.UID {
				t.Errorf("node-b's assignments %+v (%v); want on-b with uid %d", as, err, db.UID)
			}
			// node-a: no credentials of on-b, by either path.
			a := f.nodes["node-a"]
			if c, err := a.NodeCreds(ctx, "node-b", "on-b"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads on-b's assignment on node-b: %+v, %v; want permission denied", c, err)
			}
			if c, err := a.Creds(ctx, "on-b"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a reads creds/on-b: %+v, %v; want permission denied", c, err)
			}
			// node-a fails on-b: directly refused, by report ignored.
			if err := a.RecordFinish(ctx, "on-b", fleet.Finish{Outcome: fleet.Failed, Node: "node-b"}); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a writes finished/on-b: %v; want permission denied", err)
			}
			if err := a.MarkFinished(ctx, "on-b", fleet.Finish{Outcome: fleet.Failed, Node: "node-a", Message: "forged", Time: time.Now()}); err != nil {
				t.Fatalf("node-a writes its own report: %v", err)
			}
			if err := a.PutProblem(ctx, fleet.Problem{Job: "on-b", Node: "node-a", Message: "forged problem", Time: time.Now()}); err != nil {
				t.Fatalf("node-a writes its own problem report: %v", err)
			}
			for _, key := range []string{k.FinishReport("node-a", "on-b"), k.ProblemReport("node-a", "on-b")} {
				eventually(t, 10*time.Second, "the coordinator processes "+key, func() (bool, string) {
					r, err := f.root.Cli.Get(ctx, key, clientv3.WithCountOnly())
					return err == nil && r.Count == 0, fmt.Sprint(err)
				})
			}
			if fin, _, err := f.root.FinishOf(ctx, "on-b"); err != nil || fin != nil {
				t.Errorf("on-b after node-a's forged report: finish %+v, %v; want none", fin, err)
			}
			if ps, _, err := f.root.Problems(ctx, "on-b"); err != nil || len(ps) != 0 {
				t.Errorf("on-b's problems after node-a's forged report: %+v, %v; want none", ps, err)
			}
			if d, err := f.root.Desired(ctx, "on-b"); err != nil || !d.Running() {
				t.Errorf("on-b after node-a's forged report: %+v, %v; want it still running", d, err)
			}
			// node-b's own reports count: a problem, cleared, then its finish.
			b := f.nodes["node-b"]
			if err := b.PutProblem(ctx, fleet.Problem{Job: "on-b", Node: "node-b", Message: "containerd is down", Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "node-b's problem record of on-b", func() (bool, string) {
				ps, _, err := f.team.Problems(ctx, "on-b")
				return err == nil && len(ps) == 1 && ps[0].Node == "node-b" && ps[0].Message == "containerd is down", fmt.Sprintf("%+v %v", ps, err)
			})
			if err := b.DeleteProblem(ctx, "on-b", "node-b"); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "node-b's problem record of on-b cleared", func() (bool, string) {
				ps, _, err := f.team.Problems(ctx, "on-b")
				return err == nil && len(ps) == 0, fmt.Sprintf("%+v %v", ps, err)
			})
			if err := b.MarkFinished(ctx, "on-b", fleet.Finish{Outcome: fleet.Failed, Node: "node-b", Message: "exit 1", Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "on-b failed by node-b's report", func() (bool, string) {
				fin, _, err := f.team.FinishOf(ctx, "on-b")
				return err == nil && fin != nil && fin.Outcome == fleet.Failed && fin.Node == "node-b" && fin.Message == "exit 1", fmt.Sprintf("%+v %v", fin, err)
			})
			eventually(t, 10*time.Second, "on-b released", func() (bool, string) {
				d, err := f.root.Desired(ctx, "on-b")
				return err == nil && !d.Running(), fmt.Sprintf("%+v %v", d, err)
			})
			if d, err := f.root.Desired(ctx, "on-a"); err != nil || !d.Running() {
				t.Errorf("on-a: %+v, %v; want it running", d, err)
			}
		})
	}
}

// A deleted job's etcd user is revoked as soon as the coordinator sees the
// deletion, even while a node is still in its rendezvous (which used to
// keep it until the node left): its hyperpodrun's etcd calls fail within
// a second or two.
func TestDeletedJobsUserIsRevokedAtOnce(t *testing.T) {
	for name, start := range authBackends() {
		t.Run(name, func(t *testing.T) {
			f := startAuthFleet(t, start(t), Config{})
			ctx, k := f.ctx, f.root.Keys
			if err := f.team.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "gone", Team: "a", Flavor: "trainium2", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1},
				Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
				t.Fatal(err)
			}
			placedOn(t, f, "gone")
			var creds *fleet.JobCreds
			eventually(t, 10*time.Second, "the job's credentials on node-b", func() (bool, string) {
				var err error
				creds, err = f.nodes["node-b"].NodeCreds(ctx, "node-b", "gone")
				return err == nil && creds != nil, fmt.Sprint(err)
			})
			pw := filepath.Join(t.TempDir(), "job.password")
			if err := os.WriteFile(pw, []byte(creds.Password), 0o600); err != nil {
				t.Fatal(err)
			}
			job, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: f.eps, User: creds.User, Password: creds.Password})
			if err != nil {
				t.Fatalf("the job's user connects: %v", err)
			}
			defer job.Close()
			// The job's hyperpodrun is in its rendezvous on node-b.
			if _, err := job.Put(ctx, k.Rdzv("gone").Member("node-b"), `{"node":"node-b"}`); err != nil {
				t.Fatalf("the job writes its rendezvous: %v", err)
			}
			if err := f.team.DeleteJob(ctx, "gone"); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			eventually(t, 2*time.Second, "the deleted job's user refused", func() (bool, string) {
				gctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := job.Get(gctx, k.Checkpoint("gone"))
				return err != nil && !strings.Contains(err.Error(), "deadline"), fmt.Sprint(err)
			})
			_, gerr := job.Get(ctx, k.Checkpoint("gone"))
			t.Logf("the deleted job's user was refused %v after the delete: %v", time.Since(deleted).Round(time.Millisecond), gerr)
			if _, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: f.eps, User: creds.User, Password: creds.Password}); err == nil {
				t.Error("the deleted job's user still authenticates")
			}
		})
	}
}
