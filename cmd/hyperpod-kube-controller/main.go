// Command hyperpod-kube-controller is the ElasticJob controller
// (operator-shim/kubernetes): it turns ElasticJobs into the coordinator's
// job specs and the coordinator's allocations into pods, one per allocated
// node. The same binary is the job pods' supervisor ("pod") and their
// init container ("install").
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/podsup"
)

func main() { os.Exit(run(os.Args, os.Stderr)) }

type usageError struct{ error }

// etcdSet is how the controller and the pod supervisor take the --etcd-*
// flags.
var etcdSet = etcdflags.Set{DefaultEndpoints: []string{etcdflags.DefaultEndpoint}}

func run(args []string, stderr io.Writer) int {
	app := &cli.App{
		Name:  "hyperpod-kube-controller",
		Usage: "the ElasticJob controller: Kubernetes <-> the coordinator's fleet records",
		Commands: []*cli.Command{
			{
				Name:  "run",
				Usage: "run the controller",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "kubeconfig", EnvVars: []string{"KUBECONFIG"}, Usage: "kubeconfig file (default: the in-cluster ServiceAccount)"},
					&cli.StringFlag{Name: "pod-etcd-endpoints", Usage: "etcd endpoints as the job pods reach them (default --etcd-endpoints)"},
					&cli.StringFlag{Name: "launcher-image", Value: manifests.Image, Usage: "image holding hyperpod-kube-controller and a static hyperpodrun, copied into each job pod by its init container"},
					&cli.BoolFlag{Name: "leader-elect", Usage: "run only while holding the Lease (two replicas for HA)"},
					&cli.StringFlag{Name: "leader-election-namespace", EnvVars: []string{"POD_NAMESPACE"}, Value: manifests.Namespace},
					&cli.StringFlag{Name: "leader-election-id", Value: manifests.LeaseName},
					&cli.StringFlag{Name: "id", EnvVars: []string{"POD_NAME"}, Usage: "name in the leader election (default hostname-pid)"},
					&cli.BoolFlag{Name: "nodes", Value: true, Usage: "register Kubernetes Nodes without a hyperpod-agent as fleet inventory"},
					&cli.BoolFlag{Name: "teams", Value: true, Usage: "apply ElasticTeams to the coordinator's team records"},
					&cli.DurationFlag{Name: "drain-margin", Value: 30 * time.Second, Usage: "added to a job's graceful timeout before a draining pod is deleted anyway"},
					&cli.StringFlag{Name: "listen", Value: "127.0.0.1:9402", Usage: "address for /healthz (empty: none)"},
					&cli.StringFlag{Name: "enroll-agents", Value: manifests.Namespace + "/" + manifests.AgentServiceAccount, Usage: "NAMESPACE/SERVICEACCOUNT of the hyperpod-agent DaemonSet: with etcd auth on, its pods enroll as their own node's etcd user (docs/kubernetes.md); empty: off"},
				}, etcdSet.Flags()...),
				Action: serve,
			},
			{
				Name:      "pod",
				Usage:     "supervise a job pod's hyperpodrun: drain it when the allocation leaves this node",
				ArgsUsage: "-- HYPERPODRUN [ARGS...]",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "job", Required: true},
					&cli.StringFlag{Name: "node", Required: true},
					&cli.StringFlag{Name: "termination-log", Value: "/dev/termination-log"},
				}, etcdSet.Flags()...),
				Action: pod,
			},
			{
				Name:      "install",
				Usage:     "copy this program and the hyperpodrun next to it into DIR (the job pods' init container)",
				ArgsUsage: "DIR",
				Action:    install,
			},
		},
		ErrWriter:      stderr,
		OnUsageError:   func(_ *cli.Context, err error, _ bool) error { return usageError{err} },
		ExitErrHandler: func(*cli.Context, error) {},
	}
	if err := app.Run(args); err != nil {
		var ec exitCode
		if errors.As(err, &ec) {
			return int(ec)
		}
		fmt.Fprintf(stderr, "hyperpod-kube-controller: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// connectEtcd reads the --etcd-* flags: how to reach etcd and the key
// prefix.
func connectEtcd(c *cli.Context) (etcdconn.Options, string, error) {
	o, prefix, err := etcdSet.Parse(c)
	if err != nil {
		return o, "", usageError{err}
	}
	return o, prefix, nil
}

func serve(c *cli.Context) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var kube *rest.Config
	var err error
	if kc := c.String("kubeconfig"); kc != "" {
		kube, err = clientcmd.BuildConfigFromFlags("", kc)
	} else {
		kube, err = rest.InClusterConfig()
		if err != nil {
			err = fmt.Errorf("%w (outside a cluster, pass --kubeconfig)", err)
		}
	}
	if err != nil {
		return usageError{fmt.Errorf("kubernetes client: %w", err)}
	}
	if d := c.Duration("drain-margin"); d < time.Second || d > time.Hour {
		return usageError{fmt.Errorf("--drain-margin %s: must be between 1s and 1h", d)}
	}
	opts, prefix, err := connectEtcd(c)
	if err != nil {
		return err
	}
	var ca []byte
	if p := opts.CACert; p != "" {
		if ca, err = os.ReadFile(p); err != nil {
			return usageError{fmt.Errorf("--etcd-cacert: %w", err)}
		}
	}
	cli, err := etcdconn.Connect(ctx, opts)
	if err != nil {
		return err
	}
	defer cli.Close()
	podEps := opts.Endpoints
	if s := c.String("pod-etcd-endpoints"); s != "" {
		podEps = strings.Split(s, ",")
	}
	cfg := kubernetes.Config{Kube: kube, Etcd: cli, Prefix: prefix, PodEndpoints: podEps, CACert: ca, Auth: opts.User != "",
		LauncherImage: c.String("launcher-image"), Nodes: c.Bool("nodes"), Teams: c.Bool("teams"), DrainMargin: c.Duration("drain-margin"), Logger: log}
	if ea := c.String("enroll-agents"); ea != "" && opts.User != "" {
		ns, sa, ok := strings.Cut(ea, "/")
		if !ok || ns == "" || sa == "" {
			return usageError{fmt.Errorf("--enroll-agents %q: want NAMESPACE/SERVICEACCOUNT", ea)}
		}
		cfg.Enroll = &kubernetes.EnrollConfig{Namespace: ns, ServiceAccount: sa}
	}
	if c.Bool("leader-elect") {
		id := c.String("id")
		if id == "" {
			h, _ := os.Hostname()
			id = fmt.Sprintf("%s-%d", h, os.Getpid())
		}
		cfg.LeaderElection = &kubernetes.LeaderElection{Namespace: c.String("leader-election-namespace"), Name: c.String("leader-election-id"), Identity: id}
	}
	ctl, err := kubernetes.New(cfg)
	if err != nil {
		return err
	}
	if addr := c.String("listen"); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return usageError{fmt.Errorf("--listen %s: %w", addr, err)}
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(l)
		defer hs.Close()
	}
	return ctl.Run(ctx)
}

func pod(c *cli.Context) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "hyperpod-pod-supervisor")
	argv := c.Args().Slice()
	if len(argv) == 0 {
		return usageError{errors.New("pod: give hyperpodrun's command line after --")}
	}
	opts, prefix, err := connectEtcd(c)
	if err != nil {
		return err
	}
	// The supervisor must not stop hyperpodrun when etcd is briefly away:
	// connect lazily, in the background of Run's watch.
	cli, err := etcdconn.Connect(context.WithoutCancel(c.Context), opts)
	if err != nil {
		log.Warn("etcd unreachable at start; hyperpodrun runs without drain-on-shrink until it is", "err", err)
		cli = nil
	}
	if cli == nil {
		code, err := podsup.RunWithoutEtcd(argv)
		if err != nil {
			return err
		}
		return exitCode(code)
	}
	defer cli.Close()
	code, err := podsup.Run(c.Context, podsup.Config{Etcd: cli, Prefix: prefix, Job: c.String("job"), Node: c.String("node"),
		Argv: argv, TerminationLog: c.String("termination-log"), Logger: log})
	if err != nil {
		return err
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

func install(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageError{errors.New("install: give the directory to copy into")}
	}
	dir := c.Args().First()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	hpr := filepath.Join(filepath.Dir(self), "hyperpodrun")
	for _, src := range []string{self, hpr} {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("install: %w (the launcher image holds hyperpodrun next to hyperpod-kube-controller)", err)
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(dst+".tmp", b, 0o755); err != nil {
			return fmt.Errorf("install: %w", err)
		}
		if err := os.Rename(dst+".tmp", dst); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}
	return nil
}
