package elastic

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// c10dDefaultPort is torch's port for a c10d endpoint given without one.
const c10dDefaultPort = 29400

// exitBarrierTimeout bounds how long the hosting node keeps the rendezvous
// up for the other nodes once its own workers are done (torch's agents wait
// at an exit barrier for up to 300 s).
const exitBarrierTimeout = 300 * time.Second

// runC10d is --rdzv-backend c10d (and hyperpod): torch's launch line with no
// etcd to run. The node that owns the endpoint's address (a local interface
// address or localhost; --rdzv-conf is_host overrides) hosts the rendezvous:
// an embedded etcd listening on that host:port. Every node, the host
// included, then joins it as an ordinary etcd-backend member. The etcd runs
// in hyperpodrun-rdzv-host, a child process. A second
// hyperpodrun on the host's machine finds the port taken and joins.
//
// Losing the hosting node loses the rendezvous, as losing torch's c10d
// store does: the other nodes cannot prove their leases, stop their
// workers at once and fail once they cannot reach the endpoint again.
func runC10d(ctx context.Context, o Options) error {
	o.defaults()
	log := o.Logger
	conf, isHost, err := takeIsHost(o.RdzvConf)
	if err != nil {
		return &ExitError{2, fmt.Errorf("--rdzv-conf: %w", err)}
	}
	o.RdzvConf = conf
	if o.RdzvEndpoint == "" || strings.Contains(o.RdzvEndpoint, ",") || strings.Contains(o.RdzvEndpoint, "://") {
		return &ExitError{2, fmt.Errorf("--rdzv-endpoint %q: the c10d backend takes one HOST:PORT, the address of the node that hosts the rendezvous (for an etcd cluster use --rdzv-backend etcd)", o.RdzvEndpoint)}
	}
	host, port, err := splitHostPort(o.RdzvEndpoint, c10dDefaultPort)
	if err != nil {
		return &ExitError{2, fmt.Errorf("--rdzv-endpoint: %w", err)}
	}
	if port == 0 {
		return &ExitError{2, fmt.Errorf("--rdzv-endpoint %q: give the port every node connects to, e.g. %s:%d", o.RdzvEndpoint, host, c10dDefaultPort)}
	}
	listen, owns := localListenAddr(ctx, host)
	if isHost != nil {
		if *isHost && !owns {
			listen = "0.0.0.0"
		}
		owns = *isHost
	}
	var srv *hostProcess
	if owns {
		addr := net.JoinHostPort(listen, strconv.Itoa(port))
		srv, err = startRdzvHost(ctx, addr)
		switch {
		case err == nil:
			log.Info("hosting the c10d rendezvous: embedded etcd", "endpoint", o.RdzvEndpoint, "listen", addr)
			defer srv.stop()
		case errors.Is(err, errInUse):
			// Another hyperpodrun of this machine hosts it: join it.
			log.Info("the c10d endpoint is already served on this machine; joining it", "endpoint", o.RdzvEndpoint)
			srv = nil
		default:
			var ee *ExitError
			if errors.As(err, &ee) {
				return err
			}
			return &ExitError{1, fmt.Errorf("host the c10d rendezvous on %s: %w", addr, err)}
		}
	}
	endpoint := "http://" + net.JoinHostPort(host, strconv.Itoa(port))
	if srv == nil {
		if err := waitReachable(ctx, net.JoinHostPort(host, strconv.Itoa(port)), o); err != nil {
			return err
		}
	}
	o.RdzvBackend, o.RdzvEndpoint = "etcd", endpoint
	// The hosted etcd does not come back when its node is lost (a restarted
	// host starts empty): give up on it after a minute, as torchrun's c10d
	// agents fail, rather than waiting out the join timeout.
	o.RegisterTimeout = time.Minute
	runErr := RunElastic(ctx, o)
	if srv != nil {
		waitOthersLeft(ctx, endpoint, o)
	}
	return runErr
}

// takeIsHost removes is_host from a --rdzv-conf list and returns its value.
func takeIsHost(conf string) (string, *bool, error) {
	var kept []string
	var isHost *bool
	for _, kv := range strings.Split(conf, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if strings.TrimSpace(k) != "is_host" {
			if strings.TrimSpace(kv) != "" {
				kept = append(kept, kv)
			}
			continue
		}
		var b bool
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "1", "true", "yes", "y", "on":
			b = true
		case "0", "false", "no", "n", "off":
		default:
			return "", nil, fmt.Errorf("is_host=%s: want true or false", v)
		}
		isHost = &b
	}
	return strings.Join(kept, ","), isHost, nil
}

// localListenAddr says whether host names this machine (localhost, a
// loopback address, or an address of one of its interfaces) and the IP to
// listen on.
func localListenAddr(ctx context.Context, host string) (string, bool) {
	if host == "localhost" {
		return "127.0.0.1", true
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupIPAddr(rctx, host)
		if err != nil {
			return "", false
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	ifaddrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return ip.String(), true
		}
		for _, a := range ifaddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ip.String(), true
			}
		}
	}
	return "", false
}

// waitReachable waits for the hosting node's endpoint to accept
// connections: nodes usually start before the host is up. It gives up after
// the join timeout (torch's c10d clients wait read_timeout, 60 s).
func waitReachable(ctx context.Context, addr string, o Options) error {
	deadline := time.Now().Add(60 * time.Second)
	if v, ok := confSeconds(o.RdzvConf, "join_timeout"); ok {
		deadline = time.Now().Add(v)
	}
	logged := false
	for {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if !logged {
			o.Logger.Info("waiting for the c10d rendezvous host", "endpoint", addr, "err", err)
			logged = true
		}
		if time.Now().After(deadline) {
			return &ExitError{1, fmt.Errorf("the c10d rendezvous host %s cannot be reached: %w (is the node that owns that address running hyperpodrun?)", addr, err)}
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-t.C:
		case s := <-o.Signals:
			t.Stop()
			return &ExitError{1, fmt.Errorf("hyperpodrun received %v while waiting for the c10d rendezvous host", s)}
		case <-ctx.Done():
			t.Stop()
			return &ExitError{1, ctx.Err()}
		}
	}
}

func confSeconds(conf, key string) (time.Duration, bool) {
	for _, kv := range strings.Split(conf, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if strings.TrimSpace(k) == key || (key == "join_timeout" && strings.TrimSpace(k) == "timeout") {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 {
				return time.Duration(f * float64(time.Second)), true
			}
		}
	}
	return 0, false
}

// rdzvHostBinary is the program that serves the hosted rendezvous. It is
// looked up next to hyperpodrun's own executable, then on PATH.
const rdzvHostBinary = "hyperpodrun-rdzv-host"

var errInUse = errors.New("address in use")

// hostProcess is a running hyperpodrun-rdzv-host: an embedded etcd in a
// child process, so that hyperpodrun itself carries no etcd server (it
// would cost every launch about 10 MB of binary and its initialisation).
// The child dies with hyperpodrun (parent-death signal).
type hostProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

func findRdzvHost() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), rdzvHostBinary)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(rdzvHostBinary); err == nil {
		return p, nil
	}
	return "", &ExitError{2, fmt.Errorf("--rdzv-backend c10d: this node hosts the rendezvous, which needs %s next to hyperpodrun or on PATH (make build puts it in bin/; install both), or run etcd and use --rdzv-backend etcd", rdzvHostBinary)}
}

// startRdzvHost starts the host program on addr and waits until it serves.
func startRdzvHost(ctx context.Context, addr string) (*hostProcess, error) {
	path, err := findRdzvHost()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	h := &hostProcess{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	line := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, stdout)
	}()
	// Wait closes the pipe: only once everything is read, or a host that
	// prints "in-use" and exits at once could lose its line (os/exec: it
	// is incorrect to call Wait before all reads from the pipe completed).
	go func() { <-read; cmd.Wait(); close(h.done) }()
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case l, ok := <-line:
		switch {
		case strings.HasPrefix(l, "ready "):
			return h, nil
		case l == "in-use":
			<-h.done
			return nil, errInUse
		case !ok:
			<-h.done
			return nil, fmt.Errorf("%s exited: %v", path, cmd.ProcessState)
		}
		h.stop()
		return nil, fmt.Errorf("%s: unexpected %q", path, l)
	case <-t.C:
	case <-ctx.Done():
	}
	h.stop()
	return nil, fmt.Errorf("%s did not serve %s within 60 s", path, addr)
}

// stop ends the host program (closing its stdin is its signal to stop) and
// waits for it, killing it after 10 s.
func (h *hostProcess) stop() {
	h.stdin.Close()
	select {
	case <-h.done:
		return
	case <-time.After(10 * time.Second):
	}
	h.cmd.Process.Kill()
	<-h.done
}

// waitOthersLeft keeps the hosted rendezvous up until every other node has
// left it (no etcd lease is left: a node revokes its own when it leaves,
// and a dead node's expires within its TTL), for at most
// exitBarrierTimeout, or until a signal.
func waitOthersLeft(ctx context.Context, endpoint string, o Options) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: etcdconn.DialOptions()})
	if err != nil {
		o.Logger.Warn("c10d host: cannot watch the other nodes leave; stopping the rendezvous now", "err", err)
		return
	}
	defer cli.Close()
	deadline := time.Now().Add(exitBarrierTimeout)
	logged := false
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := cli.Leases(lctx)
		cancel()
		if err == nil && len(r.Leases) == 0 {
			return
		}
		if !logged {
			o.Logger.Info("c10d host: keeping the rendezvous up until the other nodes have left")
			logged = true
		}
		if time.Now().After(deadline) {
			o.Logger.Warn("c10d host: other nodes still hold the rendezvous; stopping it", "waited", exitBarrierTimeout)
			return
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case s := <-o.Signals:
			t.Stop()
			o.Logger.Warn("c10d host: signal while waiting for the other nodes; stopping the rendezvous", "signal", s)
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}
