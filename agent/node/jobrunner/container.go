package jobrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The container runtime: a job whose spec names run.image runs its
// hyperpodrun in a container through containerd (Config.Containers). The
// runner's lifecycle is the same as for a host process: a drain is
// SIGUSR2 to hyperpodrun (the container's init), any end but exit 0 or a
// drain is a node failure restarted with a backoff, and the run's
// container, task and snapshot are removed when it ends. The containers
// outlive the agent: a restarted agent adopts them by label.

// containerExit is a container's non-zero end.
type containerExit struct {
	code uint32
	err  error
}

func (e *containerExit) Error() string {
	switch {
	case e.err != nil:
		return e.err.Error()
	case e.code > 128 && e.code < 128+65:
		return "was killed by " + unix.SignalName(syscall.Signal(e.code-128))
	}
	return fmt.Sprintf("exited with status %d", e.code)
}

// ContainerNProc resolves --nproc-per-node for a container: "gpu", "neuron"
// and "auto" become the number of accelerators the container gets (the
// static hyperpodrun in the container does not load NVML), other values
// pass as they are.
func ContainerNProc(nproc string, accelerators int) string {
	switch nproc {
	case "gpu", "neuron", "auto":
		if accelerators > 0 {
			return strconv.Itoa(accelerators)
		}
		if nproc == "auto" {
			return "auto"
		}
		return "1"
	case "":
		return "1"
	}
	return nproc
}

// containerSpec builds the container of one run of a job on this node; it
// writes the run's files (the rendezvous endpoint and settings, and the
// job's etcd password) into runDir, which the container mounts read-only:
// none of them is on the command line.
func (r *Runner) containerSpec(spec *fleet.JobSpec, env []string, creds *fleet.JobCreds, runDir string, gen int64, id Identity) (containers.Spec, error) {
	rt := r.cfg.Containers
	var accels int
	var plan containers.Plan
	var reg *containers.CDISpecs
	inv := r.node.Inventory
	if spec.PerNode.Accelerators > 0 && inv != nil && inv() != nil && inv().Flavor != "cpu" {
		picked, err := containers.Pick(inv(), spec.Flavor, spec.PerNode.Accelerators)
		if err != nil {
			return containers.Spec{}, fmt.Errorf("%w: %v", containers.ErrDevice, err)
		}
		if reg, err = rt.CDI(); err != nil {
			return containers.Spec{}, err
		}
		if plan, err = containers.PlanDevices(picked, reg, rt.DevRoot(), exists); err != nil {
			return containers.Spec{}, fmt.Errorf("%w: %v", containers.ErrDevice, err)
		}
		accels = len(picked)
	}
	conf := "prefix=" + r.st.Keys.Prefix()
	for _, kv := range strings.Split(r.cfg.RdzvConf, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "":
			continue
		case "cacert", "cert", "key":
			// Host paths mean nothing in the container: a copy goes in
			// the run's directory.
			b, err := os.ReadFile(v)
			if err != nil {
				return containers.Spec{}, fmt.Errorf("read the jobs' etcd %s: %w", k, err)
			}
			if err := WriteJobFile(runDir, k+".pem", b, id); err != nil {
				return containers.Spec{}, fmt.Errorf("copy the jobs' etcd %s: %w", k, err)
			}
			v = containers.RunDir + "/" + k + ".pem"
		}
		conf += "," + k + "=" + v
	}
	if creds != nil {
		if strings.ContainsAny(creds.User, ",= ") {
			return containers.Spec{}, fmt.Errorf("job %s's credentials record names user %q, which cannot pass in --rdzv-conf", creds.Job, creds.User)
		}
		if err := WriteJobFile(runDir, "etcd.password", []byte(creds.Password+"\n"), id); err != nil {
			return containers.Spec{}, fmt.Errorf("write the job's etcd password file: %w", err)
		}
		conf += ",user=" + creds.User + ",password_file=" + containers.RunDir + "/etcd.password"
	}
	files := map[string]string{
		"rdzv-endpoint": strings.Join(r.cfg.Endpoints, ","),
		"rdzv-conf":     conf,
	}
	for name, v := range files {
		if err := WriteJobFile(runDir, name, []byte(v+"\n"), id); err != nil {
			return containers.Spec{}, fmt.Errorf("write the run's %s file: %w", name, err)
		}
	}
	s := *spec
	s.Run.NProcPerNode = ContainerNProc(spec.Run.NProcPerNode, accels)
	args := Args(s, []string{"@" + containers.RunDir + "/rdzv-endpoint"}, r.st.Keys.Prefix(), "", containers.LogDir)
	for i, a := range args {
		if a == "--rdzv-conf" {
			args[i+1] = "@" + containers.RunDir + "/rdzv-conf"
		}
	}
	// The job's log directory, <log-dir>/<node>/<job>/, the job's own
	// (jobdirs.go); its console log beside it, root's.
	logDir, err := JobLogDir(r.logBase(), r.node.Name, spec.Name, id)
	if err != nil {
		return containers.Spec{}, fmt.Errorf("the job's log directory: %w", err)
	}
	consoleLog, err := JobConsoleLog(r.logBase(), r.node.Name, spec.Name)
	if err != nil {
		return containers.Spec{}, fmt.Errorf("the job's console log: %w", err)
	}
	mounts := []containers.Mount{
		{Source: runDir, Target: containers.RunDir, ReadOnly: true},
		{Source: logDir, Target: containers.LogDir},
	}
	launcher := spec.Run.Command
	if len(launcher) == 0 {
		if r.cfg.ContainerHyperpodrun == "" {
			return containers.Spec{}, errors.New("this agent has no static hyperpodrun to mount into containers (hyperpod-agent --container-hyperpodrun), and the job's run.command names none in its image")
		}
		launcher = []string{containers.HyperpodrunPath}
		mounts = append(mounts, containers.Mount{Source: r.cfg.ContainerHyperpodrun, Target: containers.HyperpodrunPath, ReadOnly: true})
	}
	// The job's own mounts: the runtime allows them only within the
	// node's --allow-mount-source, never within the agent's directories.
	var jobMounts []containers.Mount
	for _, m := range spec.Run.Mounts {
		jobMounts = append(jobMounts, containers.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	env = append(env, "HYPERPODRUN_NODE_ID="+r.node.Name)
	if spec.Run.Python != "" {
		env = append(env, "PYTHON_EXEC="+spec.Run.Python)
	}
	cs := containers.Spec{
		Job: spec.Name, Team: spec.Team, Node: r.node.Name, Generation: gen,
		Image:       spec.Run.Image,
		Args:        append(append([]string{}, launcher...), args...),
		Env:         env,
		Mounts:      mounts,
		JobMounts:   jobMounts,
		Protected:   []string{r.tmp, r.logBase()},
		AllowRoot:   r.cfg.AllowRootJobs,
		ShmSize:     int64(spec.Run.ShmSize),
		CPUs:        spec.PerNode.VCPUs,
		MemoryBytes: int64(spec.PerNode.Memory),
		Devices:     plan,
		LogPath:     consoleLog,
		RunDir:      runDir,
		CDI:         reg,
	}
	if u := id; u.Set { // the job's own uid (--job-uid-range) or --job-user
		uid, gid := u.UID, u.GID
		cs.UID, cs.GID = &uid, &gid
	}
	return cs, nil
}

// logBase is where the containers' logs go on the host:
// <log-dir>/<node>/<job>/ (see JobLogDir).
func (r *Runner) logBase() string {
	if r.cfg.LogDir != "" {
		return r.cfg.LogDir
	}
	return filepath.Join(os.TempDir(), "hyperpod-agent-logs")
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// startContainer starts a run of a job in a container. The pull and the
// start happen in the background (a pull may take minutes; the runner's
// loop goes on); the job counts as running here meanwhile, so it is not
// started twice, and a drain that comes first stops it as soon as it is up.
func (r *Runner) startContainer(ctx context.Context, spec *fleet.JobSpec, env []string, creds *fleet.JobCreds, id Identity) error {
	job := spec.Name
	if r.cfg.Containers == nil {
		msg := fmt.Sprintf("node %s runs jobs as host processes (hyperpod-agent --runtime process), and the job names image %s: run the node's agent with --runtime containerd, or drop run.image", r.node.Name, spec.Run.Image)
		return r.failOnNode(job, msg)
	}
	// No container starts before this node's earlier containers are
	// adopted: a job's second container on the node would be a duplicate.
	if err := r.adoptContainers(ctx); err != nil {
		err = fmt.Errorf("containerd at %s: %w", r.cfg.Containers.Address(), err)
		r.problem(job, fmt.Sprintf("cannot start the job's container: %v", err))
		return err
	}
	r.mu.Lock()
	if _, running := r.jobs[job]; running || !r.mayStart() {
		r.mu.Unlock()
		return nil
	}
	runDir, err := RunDir(r.tmp, containerRunPrefix(r.node.Name), id)
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("make the run's directory: %w", err)
	}
	p := &proc{done: make(chan struct{}), started: time.Now(), maxRestarts: spec.Run.MaxRestarts, grace: graceOf(spec, r.cfg.DrainMargin), starting: true}
	r.jobs[job] = p
	r.wg.Add(1)
	r.mu.Unlock()
	cs, err := r.tracedContainerSpec(spec, env, creds, runDir, r.gens[job], id)
	go func() {
		defer r.wg.Done()
		var task *containers.Task
		var logOffset int64
		if err == nil {
			sctx, cancel := context.WithTimeout(ctx, r.cfg.ContainerStartTimeout)
			// The console follows the log from where this run's
			// output begins: measured before the task can write.
			logOffset = containers.Size(cs.LogPath)
			task, err = r.cfg.Containers.Start(sctx, cs)
			cancel()
		}
		if err != nil && ctx.Err() != nil {
			// The runner stops: nothing to judge.
			os.RemoveAll(runDir)
			r.release(job, p, false)
			return
		}
		if err != nil {
			os.RemoveAll(runDir)
			draining := r.release(job, p, true)
			switch {
			case draining:
				r.log.Info("job moved off this node before its container started", "job", job, "err", err)
				r.forget(job)
			case errors.Is(err, containers.ErrImageNotFound) || errors.Is(err, containers.ErrDevice):
				r.failOnNode(job, fmt.Sprintf("node %s cannot run the job's container: %v", r.node.Name, err))
			case errors.Is(err, containers.ErrRefused):
				// Nothing was made; the record says why and what fixes
				// it (describe job), and the job is tried again later
				// (the spec or the node's flags may change).
				r.problem(job, fmt.Sprintf("node %s refuses the job's container: %v", r.node.Name, err))
				r.restartLater(job, fmt.Sprintf("its container is refused: %v", err), 0)
			default:
				r.problem(job, fmt.Sprintf("cannot start the job's container: %v", err))
				r.restartLater(job, fmt.Sprintf("cannot start its container: %v", err), 0)
			}
			return
		}
		r.log.Info("started job in a container", "job", job, "container", task.ID, "image", cs.Image, "pid", task.Pid(), "log", task.LogPath)
		r.mu.Lock()
		r.started(job, p)
		r.mu.Unlock()
		r.watchContainer(job, p, task, logOffset)
	}()
	return nil
}

// watchContainer follows a running container of job until it ends, then
// removes it and judges its end as for a host process.
func (r *Runner) watchContainer(job string, p *proc, task *containers.Task, logOffset int64) {
	r.mu.Lock()
	p.starting = false
	p.signal = task.Signal
	p.kill = func() { task.Kill() }
	draining := p.draining
	r.mu.Unlock()
	if draining {
		// Moved off this node while it started: nothing trained yet.
		task.Kill()
	}
	stop := make(chan struct{})
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		containers.Follow(task.LogPath, logOffset, r.cfg.Output, r.node.Name+"/"+job+" ", stop, r.quit)
	}()
	wctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-r.quit:
			cancel()
		case <-wctx.Done():
		}
	}()
	ex, werr := task.Wait(wctx)
	cancel()
	close(stop)
	<-followed
	if werr != nil {
		// The agent is stopping without a drain: the container goes on,
		// and the next agent adopts it.
		return
	}
	ran := time.Since(p.started)
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := task.Remove(rctx); err != nil {
		r.log.Warn("cannot remove the run's container", "job", job, "container", task.ID, "err", err)
	}
	rcancel()
	if d := filepath.Dir(task.RunDir); task.RunDir != "" && (d == r.tmp || strings.HasPrefix(filepath.Base(d), "hyperpod-agent")) {
		os.RemoveAll(task.RunDir)
	}
	var err error
	if ex.Code != 0 || ex.Err != nil {
		err = &containerExit{code: ex.Code, err: ex.Err}
	}
	draining = r.release(job, p, err != nil)
	r.log.Info("job's container ended", "job", job, "container", task.ID, "exit_code", ex.Code, "drained", draining)
	if draining {
		r.traceDrain(job, p.drainedAt, err)
	}
	r.exited(job, err, draining, ran, p.maxRestarts)
}

// adoptContainers takes over the containers an earlier agent of this node
// started: each goes on as this runner's run of its job (no duplicate is
// started); a second container of the same job is stopped.
func (r *Runner) adoptContainers(ctx context.Context) error {
	if r.adopted {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tasks, err := r.cfg.Containers.Adopt(actx, r.node.Name)
	if err != nil {
		return err
	}
	stop := func(task *containers.Task) {
		task.Kill()
		task.Wait(actx)
		task.Remove(actx)
	}
	for _, task := range tasks {
		if err := r.reclaimUID(task); err != nil {
			// Two jobs never share a uid on a host: the job starts again
			// once its uid is its own.
			r.log.Error("stopping an adopted container: it runs as a uid another job holds on this host", "job", task.Job, "container", task.ID, "uid", task.UID, "err", err)
			stop(task)
			continue
		}
		r.mu.Lock()
		_, dup := r.jobs[task.Job]
		if dup || task.Job == "" {
			r.mu.Unlock()
			r.log.Warn("stopping a second container of a job on this node", "job", task.Job, "container", task.ID)
			stop(task)
			continue
		}
		p := &proc{done: make(chan struct{}), started: time.Now(), grace: 30 * time.Second, starting: true}
		if spec, err := r.st.Job(actx, task.Job); err == nil {
			p.maxRestarts, p.grace = spec.Run.MaxRestarts, graceOf(spec, r.cfg.DrainMargin)
		}
		r.jobs[task.Job] = p
		r.wg.Add(1)
		r.mu.Unlock()
		r.log.Info("adopted the job's running container", "job", task.Job, "container", task.ID, "pid", task.Pid(), "generation", task.Generation)
		go func() {
			defer r.wg.Done()
			r.watchContainer(task.Job, p, task, containers.Size(task.LogPath))
		}()
	}
	r.adopted = true
	return nil
}

// reclaimUID claims again, for an adopted container's job, the uid of its
// own it runs as, so that the claim is kept while the job is on this node
// and released (with its log directory taken back) when it leaves: no
// other job may be given that uid here meanwhile, across agent restarts.
// An error means another job holds the uid.
func (r *Runner) reclaimUID(task *containers.Task) error {
	if task.Job == "" || !r.cfg.UIDRange.Contains(task.UID) {
		return nil // the image's user or --job-user: not a uid of the job's own
	}
	if err := r.claimUID(task.Job, task.UID); err != nil {
		return err
	}
	r.log.Info("adopted container's uid claimed again", "job", task.Job, "uid", task.UID)
	return nil
}

// failOnNode fails a job because of what this node found (a bad image, a
// missing device, a runtime that cannot run it); the message is the job's
// status (elasticctl describe job). The node itself is not at fault.
func (r *Runner) failOnNode(job, msg string) error {
	r.forget(job)
	r.log.Warn("job failed on this node", "job", job, "why", msg)
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if err := r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: msg, Time: time.Now().UTC()}); err != nil {
		return fmt.Errorf("%s (and recording it: %w)", msg, err)
	}
	return nil
}

// problem records why this node cannot run a job right now (e.g.
// containerd down); elasticctl describe job shows it until the job runs.
func (r *Runner) problem(job, msg string) {
	r.mu.Lock()
	if _, ok := r.problems[job]; !ok {
		r.problems[job] = false // cleared once a run starts (started)
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if err := r.st.PutProblem(ctx, fleet.Problem{Job: job, Node: r.node.Name, Message: msg, Time: time.Now().UTC()}); err != nil {
		r.log.Warn("cannot record the job's problem on this node", "job", job, "err", err)
	}
}

// clearProblem removes this node's problem record of a job, if any.
func (r *Runner) clearProblem(job string) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if err := r.st.DeleteProblem(ctx, job, r.node.Name); err != nil {
		r.log.Warn("cannot clear the job's problem record", "job", job, "err", err)
	}
}

// graceOf is how long a drained run may take before it is SIGKILLed: the
// job's graceful timeout (hyperpodrun's own budget for its workers'
// checkpoint) plus margin (Config.DrainMargin, 30 s) for hyperpodrun
// itself; 2 min without one.
func graceOf(spec *fleet.JobSpec, margin time.Duration) time.Duration {
	if g := spec.Run.GracefulTimeoutSeconds; g > 0 {
		return time.Duration(g*float64(time.Second)) + margin
	}
	return 2 * time.Minute
}
