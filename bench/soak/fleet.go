package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"gopkg.in/yaml.v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The soak's fleet: etcd, the coordinators and node agents as real
// processes, their etcd users and directories, the team and its jobs.

func (s *soak) startEtcd(ctx context.Context) error {
	args := []string{"--name", "soak", "--data-dir", filepath.Join(s.work, "etcd"),
		"--listen-client-urls", s.endpoint, "--advertise-client-urls", s.endpoint,
		"--listen-peer-urls", s.peer, "--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", "soak=" + s.peer, "--log-level", "warn"}
	if s.cfg.auth {
		// JWT tokens, as docs/security.md asks of production etcds: a
		// simple token dies with an etcd restart, and etcd's Go client
		// keeps retrying its watches with the dead one (etcd-io/etcd#11954).
		flag, err := jwtKeys(filepath.Join(s.work, "etcd-jwt"))
		if err != nil {
			return err
		}
		// Every user's password is generated (docs/security.md).
		args = append(args, "--auth-token", flag, "--bcrypt-cost", "4")
	}
	c, err := s.sup.start("etcd", s.cfg.etcdBin, args...)
	if err != nil {
		return err
	}
	s.etcd = c
	// Ready when it answers a read.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: time.Second, Logger: nopZap()})
	if err != nil {
		return err
	}
	defer cli.Close()
	return s.until(ctx, 30*time.Second, func() bool {
		if c.exited() {
			return true
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := cli.Status(rctx, s.endpoint) // needs no user once auth is on
		return err == nil
	})
}

func (s *soak) startCoordinator(i int) error {
	name := fmt.Sprintf("coordinator-%d", i)
	args := append(s.authFlags(etcdauth.CoordinatorUser), "--etcd-endpoints", s.endpoint,
		"--id", name, "--listen=", "--resync", "1s", "--min-stable-period", "10s")
	if s.perJobUIDs {
		args = append(args, "--job-uid-range", soakUIDRange)
	}
	c, err := s.sup.start(name, filepath.Join(s.bin, "hyperpod-coordinator"), args...)
	if err != nil {
		return err
	}
	s.coords[i] = c
	return nil
}

func (s *soak) startAgent(i int) error {
	node := nodeName(i)
	fixture := filepath.Join(s.cfg.repo, "devices", "testdata", "neuron", "inf2")
	user := etcdauth.AgentUser
	if s.cfg.isolation {
		user = etcdauth.NodeRole(node)
	}
	args := append(append([]string{"run"}, s.authFlags(user)...),
		"--etcd-endpoints", s.endpoint, "--node-name", node, "--listen=", "--lease-ttl", "5s",
		"--disable-nvml", "--neuron-sysfs-root", filepath.Join(fixture, "sys", "devices", "virtual", "neuron_device"),
		"--dev-root", filepath.Join(fixture, "dev"),
		"--run-jobs", "--hyperpodrun", filepath.Join(s.bin, "hyperpodrun"), "--job-log-dir", filepath.Join(s.work, "joblogs"),
		// The DDP jobs' short hang timeouts (faults24.go's worker_hang).
		"--allow-job-env", "PET_HANG_TIMEOUT", "--allow-job-env", "PET_HANG_STARTUP_TIMEOUT")
	if s.perJobUIDs {
		// Each job as its own uid, in a run-dir base of the soak's own
		// (removed with it, whatever a killed agent left there).
		args = append(args, "--job-uid-range", soakUIDRange, "--job-run-dir", filepath.Join(s.work, "run"))
	} else {
		args = append(args, "--allow-root-jobs")
	}
	c, err := s.sup.start("agent-"+node, filepath.Join(s.bin, "hyperpod-agent"), args...)
	if err != nil {
		return err
	}
	s.agents[i] = c
	return nil
}

// soakUIDRange is the coordinator's and the agents' --job-uid-range (the
// coordinator's default).
const soakUIDRange = "200000-299999"

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// makeDirs makes the work directory's parts. With per-job uids the jobs
// traverse the work directory (0711: to their run directories, what they
// read and their checkpoints) without listing it; bin (binaries, the DDP
// script) is 0755, ckpt sticky and world-writable (1777, like /tmp or a
// shared scratch file system: each job creates its own directory there),
// and what no job needs (the daemons' logs, etcd's data, the specs) 0700.
func (s *soak) makeDirs() error {
	modes := map[string]os.FileMode{"bin": 0o755, "logs": 0o755, "etcd": 0o755, "joblogs": 0o755, "ckpt": 0o755, "specs": 0o755}
	if s.perJobUIDs {
		if err := os.Chmod(s.work, 0o711); err != nil {
			return err
		}
		modes["logs"], modes["etcd"], modes["specs"] = 0o700, 0o700, 0o700
		modes["ckpt"] = os.ModeSticky | 0o777
	}
	for d, m := range modes {
		p := filepath.Join(s.work, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, m); err != nil {
			return err
		}
	}
	return nil
}

func (s *soak) passwordDir() string { return filepath.Join(s.work, "etcd-passwords") }

func (s *soak) passwordFile(user string) string {
	return filepath.Join(s.passwordDir(), user+".password")
}

// authFlags are the --etcd-user and --etcd-password-file flags of user
// (none with auth off).
func (s *soak) authFlags(user string) []string {
	if !s.cfg.auth {
		return nil
	}
	return []string{"--etcd-user", user, "--etcd-password-file", s.passwordFile(user)}
}

func (s *soak) waitNodes(ctx context.Context) error {
	err := s.until(ctx, time.Minute, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := s.etcdCli.Get(rctx, s.keys.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count >= nodes
	})
	if err != nil {
		return fmt.Errorf("the node agents did not register: %w (see %s)", err, filepath.Join(s.work, "logs"))
	}
	return nil
}

// elasticctl runs elasticctl against the soak's etcd.
func (s *soak) elasticctl(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	global := []string{"--etcd-endpoints", s.endpoint}
	if s.cfg.auth && args[0] != "auth" {
		// Teams and quotas are the admin's; jobs the team's.
		user := etcdauth.TeamRole(teamName)
		if args[0] == "apply" {
			user = etcdauth.AdminUser
		}
		global = append(global, s.authFlags(user)...)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "elasticctl"), append(global, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := s.sup.output(cmd)
	if err != nil {
		return out, fmt.Errorf("elasticctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (s *soak) applyTeam(ctx context.Context) error {
	b, err := yaml.Marshal(map[string][]api.Team{"teams": {{Name: teamName, Weight: 1,
		Quotas: []api.FlavorQuota{{Flavor: flavor, Nominal: nodes * 12}}}}})
	if err != nil {
		return err
	}
	f := filepath.Join(s.work, "specs", "teams.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		return err
	}
	_, err = s.elasticctl(ctx, "apply", "-f", f)
	return err
}

// submit submits the next generation of a job kind with `elasticctl submit`
// (retried while etcd is down).
func (s *soak) submit(ctx context.Context, kind string) error {
	s.mu.Lock()
	s.gens[kind]++
	gen := s.gens[kind]
	s.mu.Unlock()
	name := fmt.Sprintf("soak-%s-%d", kind, gen)
	ckpt := filepath.Join(s.work, "ckpt", name)
	spec := fleet.JobSpec{Job: api.Job{Name: name, Team: teamName, Flavor: flavor, PerNode: api.Resources{Accelerators: perNodeAccel},
		MinNodes: 1, MaxNodes: nodes, Elastic: true},
		Run: fleet.RunSpec{NProcPerNode: "1", MaxRestarts: 100, GracefulTimeoutSeconds: 20,
			// Jobs do not inherit the agent's environment: the mark that
			// tells the soak's processes from the machine's travels in the
			// spec.
			Env: map[string]string{markVar: s.mark}}}
	steps := s.cfg.ddpSteps
	if kind == kindDDP {
		spec.Run.Script = s.ddpScript
		spec.Run.Python = s.cfg.python
		// Beside the mark (without it the soak would not see the DDP
		// job's processes at all).
		spec.Run.Env["OMP_NUM_THREADS"] = "1"
		hangTimeoutEnv(spec.Run.Env)
		spec.Run.Args = []string{"--steps", strconv.Itoa(steps), "--step-time", "0.1", "--ckpt-every", "10",
			"--ckpt-dir", ckpt, "--backend", "gloo", "--dist-timeout", "60"}
	} else {
		steps = s.cfg.workerSteps
		spec.Run.Script = filepath.Join(s.bin, "worker")
		spec.Run.NoPython = true
		spec.Run.Args = []string{"--steps", strconv.Itoa(steps), "--step-time", "100ms", "--ckpt-every", "20", "--ckpt-dir", ckpt}
	}
	b, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	f := filepath.Join(s.work, "specs", name+".yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		return err
	}
	s.jobs.add(&jobState{name: name, kind: kind, gen: gen, steps: steps, submitted: time.Now()})
	for {
		_, err = s.elasticctl(ctx, "submit", "-f", f)
		if err == nil {
			s.log.Info("submitted", "job", name, "steps", steps)
			return nil
		}
		s.log.Warn("submit failed; retrying", "job", name, "err", err)
		if err := sleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
}

// --- the monitors ---

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// jwtKeys writes an RSA key pair for etcd's JWT auth tokens into dir (once)
// and returns the --auth-token value.
func jwtKeys(dir string) (string, error) {
	priv, pub := filepath.Join(dir, "priv.pem"), filepath.Join(dir, "pub.pem")
	flag := fmt.Sprintf("jwt,pub-key=%s,priv-key=%s,sign-method=RS256,ttl=24h", pub, priv)
	if _, err := os.Stat(priv); err == nil {
		return flag, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", err
	}
	return flag, nil
}
