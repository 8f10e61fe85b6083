package kubernetes

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Config tunes the controller.
type Config struct {
	// Kube is the Kubernetes client configuration.
	Kube *rest.Config
	// Etcd is the fleet's etcd; Prefix its layout's prefix.
	Etcd   *clientv3.Client
	Prefix string
	// PodEndpoints are the etcd endpoints the job pods reach.
	PodEndpoints []string
	// CACert is the CA of etcd's server certificate, copied into each job's
	// Secret for its pods (nil: plain http).
	CACert []byte
	// Auth: etcd auth is on; a job's pods get the credentials the
	// coordinator minted for it (creds/<job>), and wait for them.
	Auth bool
	// LauncherImage holds hyperpod-kube-controller and a static hyperpodrun.
	LauncherImage string
	// Nodes bridges Kubernetes Nodes without a hyperpod-agent into the
	// fleet's inventory; Teams applies ElasticTeams.
	Nodes, Teams bool
	// Enroll, when set, judges hyperpod-agent pods' enrollment requests
	// (Enroller): each agent pod gets its own node's etcd user.
	Enroll *EnrollConfig
	// LeaderElection, when set, runs the controller only while it holds
	// the Lease.
	LeaderElection *LeaderElection
	// DrainMargin is added to a job's graceful timeout before a draining
	// pod is deleted anyway (default 30s).
	DrainMargin time.Duration
	// Resync re-reads every job this often, for time-based rules (default 10s).
	Resync time.Duration
	// Workers reconcile jobs in parallel (default 2).
	Workers int
	Logger  *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// LeaderElection names the controller's coordination.k8s.io Lease.
type LeaderElection struct {
	Namespace, Name, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as client-go's
	// (defaults 15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Controller is the ElasticJob controller.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	store    *fleet.Store
	kube     kubernetes.Interface
	crd      *Client
	recorder record.EventRecorder
	queue    workqueue.TypedRateLimitingInterface[string]
	jobs     cache.SharedIndexInformer
	pods     cache.SharedIndexInformer

	mu          sync.Mutex
	drainSince  map[types.UID]time.Time
	deletedByUs map[types.UID]bool
	reported    map[types.UID]bool // deletions by others, reported
	kept        map[types.UID]bool // failed pods kept for their logs
	backoff     map[string]backoff // job NUL node -> failures there
	secrets     map[string]string  // job -> hash of the Secret written
	leading     bool
}

const byJob = "job"

// New returns a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Kube == nil || cfg.Etcd == nil {
		return nil, errors.New("kubernetes controller: needs a Kubernetes configuration and an etcd client")
	}
	if cfg.DrainMargin <= 0 {
		cfg.DrainMargin = 30 * time.Second
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	kube, err := kubernetes.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	crd, err := NewClient(cfg.Kube)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, log: cfg.Logger, store: fleet.New(cfg.Etcd, cfg.Prefix), kube: kube, crd: crd,
		drainSince: map[types.UID]time.Time{}, deletedByUs: map[types.UID]bool{}, reported: map[types.UID]bool{}, kept: map[types.UID]bool{}, backoff: map[string]backoff{}, secrets: map[string]string{}}, nil
}

// Leading reports whether this controller is working (holds the Lease, or
// runs without leader election).
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

// Run runs the controller until ctx ends. With leader election it works
// only while it holds the Lease, and returns an error when it loses it
// (the process should exit and start over, as client-go's controllers do).
func (c *Controller) Run(ctx context.Context) error {
	le := c.cfg.LeaderElection
	if le == nil {
		return c.work(ctx)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     c.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	dur := func(d, def time.Duration) time.Duration {
		if d <= 0 {
			return def
		}
		return d
	}
	var acquired atomic.Bool
	workDone := make(chan error, 1)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: le.Name,
		LeaseDuration: dur(le.LeaseDuration, 15*time.Second), RenewDeadline: dur(le.RenewDeadline, 10*time.Second), RetryPeriod: dur(le.RetryPeriod, 2*time.Second),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				acquired.Store(true)
				c.log.Info("leading: reconciling ElasticJobs", "lease", le.Namespace+"/"+le.Name, "identity", le.Identity)
				workDone <- c.work(lctx)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elector.Run(ctx)
	// Run returns once the Lease is lost or released; the work it started
	// stops with it (its context is cancelled): wait for it to be done.
	var workErr error
	if acquired.Load() {
		workErr = <-workDone
	}
	if ctx.Err() != nil {
		return workErr
	}
	return fmt.Errorf("lost the leader-election Lease %s/%s", le.Namespace, le.Name)
}

// work is the controller proper.
func (c *Controller) work(ctx context.Context) error {
	// Decisions, pods and drains of a busy job come in bursts: allow more
	// than client-go's default of 25 events per object before throttling.
	bc := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{BurstSize: 200, QPS: 0.2}))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kube.CoreV1().Events("")})
	defer bc.Shutdown()
	c.recorder = bc.NewRecorder(Scheme, corev1.EventSource{Component: "hyperpod-kube-controller"})
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "elasticjobs"})
	defer c.queue.ShutDown()

	c.jobs = cache.NewSharedIndexInformer(cache.NewListWatchFromClient(c.crd.RESTClient(), v1alpha1.ElasticJobs, metav1.NamespaceAll, fields.Everything()),
		&v1alpha1.ElasticJob{}, 0, cache.Indexers{byJob: func(o any) ([]string, error) { return []string{o.(*v1alpha1.ElasticJob).Name}, nil }})
	hasJob, _ := labels.NewRequirement(JobLabel, selection.Exists, nil)
	c.pods = cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(c.kube.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = labels.NewSelector().Add(*hasJob).String() }),
		&corev1.Pod{}, 0, cache.Indexers{byJob: func(o any) ([]string, error) { return []string{o.(*corev1.Pod).Labels[JobLabel]}, nil }})
	enqueueJob := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if j, ok := o.(*v1alpha1.ElasticJob); ok {
			c.queue.Add(j.Name)
		}
	}
	c.jobs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueueJob, UpdateFunc: func(_, n any) { enqueueJob(n) }, DeleteFunc: enqueueJob})
	enqueuePod := func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			c.queue.Add(p.Labels[JobLabel])
			if p.DeletionTimestamp != nil {
				c.deletedByOthers(p)
			}
			if p.DeletionTimestamp != nil || ViewOf(p, trainerName(p), time.Time{}).Ended() {
				c.enqueueAll() // its node may be free for another job's pod now
			}
		}
	}
	c.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueuePod, UpdateFunc: func(_, n any) { enqueuePod(n) }, DeleteFunc: c.podDeleted})
	go c.jobs.Run(ctx.Done())
	go c.pods.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.jobs.HasSynced, c.pods.HasSynced) {
		return ctx.Err()
	}
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	run(c.watchEtcd)
	if c.cfg.Nodes {
		run(c.bridgeNodes)
	}
	if c.cfg.Teams {
		run(c.bridgeTeams)
	}
	if c.cfg.Enroll != nil {
		run(NewEnroller(c.kube, c.cfg.Etcd, c.cfg.Prefix, *c.cfg.Enroll, c.recorder, c.log).Run)
	}
	for range c.cfg.Workers {
		run(func(ctx context.Context) {
			for c.next(ctx) {
			}
		})
	}
	c.mu.Lock()
	c.leading = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.leading = false
		c.mu.Unlock()
	}()
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.queue.ShutDown()
			wg.Wait()
			return nil
		case <-tick.C:
			for _, k := range c.jobs.GetIndexer().ListIndexFuncValues(byJob) {
				c.queue.Add(k)
			}
		}
	}
}

func (c *Controller) next(ctx context.Context) bool {
	job, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(job)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	after, err := c.reconcile(rctx, job)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		c.log.Warn("reconcile failed; retrying", "job", job, "err", err)
		c.queue.AddRateLimited(job)
	case after > 0:
		c.queue.Forget(job)
		c.queue.AddAfter(job, after)
	default:
		c.queue.Forget(job)
	}
	return true
}

// enqueueAll asks for every job to be reconciled.
func (c *Controller) enqueueAll() {
	for _, k := range c.jobs.GetIndexer().ListIndexFuncValues(byJob) {
		c.queue.Add(k)
	}
}

// podDeleted notices pods deleted by someone else (a node failure) that
// went without a graceful deletion first.
func (c *Controller) podDeleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	if !ViewOf(p, trainerName(p), time.Time{}).Ended() || p.DeletionTimestamp != nil {
		c.deletedByOthers(p)
	}
	c.mu.Lock()
	delete(c.deletedByUs, p.UID)
	delete(c.drainSince, p.UID)
	delete(c.reported, p.UID)
	delete(c.kept, p.UID)
	c.mu.Unlock()
	c.queue.Add(p.Labels[JobLabel])
	c.enqueueAll()
}

// deletedByOthers reports, once, a pod deletion the controller did not
// ask for: a node failure. The job goes on without the pod (its members
// leave the rendezvous), and a new pod joins while the node stays
// allocated.
func (c *Controller) deletedByOthers(p *corev1.Pod) {
	c.mu.Lock()
	skip := c.deletedByUs[p.UID] || c.reported[p.UID]
	c.reported[p.UID] = true
	c.mu.Unlock()
	if skip {
		return
	}
	if ej := c.owner(p.Labels[JobLabel], p.Namespace); ej != nil {
		c.recorder.Eventf(ej, corev1.EventTypeWarning, ReasonNodeFailure,
			"pod %s on node %s was deleted by someone else: a node failure; the job goes on without it, and a new pod joins while the node stays allocated", p.Name, p.Spec.NodeName)
	}
}

// owner is the ElasticJob of job in namespace (nil when none).
func (c *Controller) owner(job, namespace string) *v1alpha1.ElasticJob {
	objs, _ := c.jobs.GetIndexer().ByIndex(byJob, job)
	for _, o := range objs {
		if ej := o.(*v1alpha1.ElasticJob); ej.Namespace == namespace {
			return ej
		}
	}
	return nil
}

func trainerName(p *corev1.Pod) string {
	if len(p.Spec.Containers) == 0 {
		return TrainerName
	}
	return p.Spec.Containers[0].Name
}

// watchEtcd turns changes of the fleet's records into work: a job's
// desired record, status, finish record, credentials or spec changed ->
// reconcile it; a decision event -> a Kubernetes Event on its ElasticJob.
func (c *Controller) watchEtcd(ctx context.Context) {
	k := c.store.Keys
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := c.cfg.Etcd.Get(gctx, k.Root(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		cancel()
		if err != nil {
			c.log.Warn("etcd unreachable; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		wch := c.cfg.Etcd.Watch(clientv3.WithRequireLeader(ctx), k.Root(), clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
		for w := range wch {
			if err := w.Err(); err != nil {
				c.log.Warn("etcd watch ended; starting over", "err", err)
				break
			}
			for _, ev := range w.Events {
				c.etcdEvent(ev)
			}
		}
		// Anything may have changed while the watch was down.
		for _, j := range c.jobs.GetIndexer().ListIndexFuncValues(byJob) {
			c.queue.Add(j)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func (c *Controller) etcdEvent(ev *clientv3.Event) {
	k := c.store.Keys
	key := string(ev.Kv.Key)
	if _, job, ok := k.SpecOwner(key); ok {
		c.queue.Add(job)
		return
	}
	if job := k.JobOfKey(key); job != "" { // desired, status, finished, problems
		c.queue.Add(job)
		return
	}
	if job, ok := k.JobOfRestartsKey(key); ok { // hyperpodrun restarted the workers
		c.queue.Add(job)
		return
	}
	if job, ok := strings.CutPrefix(key, k.CredsPrefix()); ok && job != "" && !strings.Contains(job, "/") {
		c.queue.Add(job)
		return
	}
	if ev.Type != clientv3.EventTypePut || !strings.HasPrefix(key, k.EventsPrefix()) {
		return
	}
	e, err := fleet.DecodeEvent(key, ev.Kv.Value)
	if err != nil {
		c.log.Warn("ignoring a malformed decision event", "err", err)
		return
	}
	objs, _ := c.jobs.GetIndexer().ByIndex(byJob, e.Job)
	for _, o := range objs {
		ej := o.(*v1alpha1.ElasticJob)
		typ := DecisionEventType(e.Kind, e.Code)
		msg := KubeAdvice(ej, e.Code, e.Message)
		if e.FromSize != e.ToSize {
			msg = fmt.Sprintf("%s (%d -> %d nodes)", msg, e.FromSize, e.ToSize)
		}
		c.recorder.Event(ej, typ, string(e.Kind), msg)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// claim picks, among the ElasticJobs named job, the one that owns the job
// spec in etcd: the one the spec's owner marker names, else (no spec) the
// oldest. The others cannot run under that name.
func claim(objs []*v1alpha1.ElasticJob, spec *fleet.JobSpec) (owner *v1alpha1.ElasticJob, others []*v1alpha1.ElasticJob, foreign bool) {
	sort.Slice(objs, func(i, j int) bool {
		if !objs[i].CreationTimestamp.Equal(&objs[j].CreationTimestamp) {
			return objs[i].CreationTimestamp.Before(&objs[j].CreationTimestamp)
		}
		return objs[i].Namespace < objs[j].Namespace
	})
	mark := ""
	if spec != nil {
		mark = spec.Run.Env[OwnerEnv]
		if mark == "" {
			return nil, objs, true // a job of elasticctl holds the name
		}
	}
	for _, ej := range objs {
		if owner == nil && (mark == "" || mark == Owner(ej)) {
			owner = ej
			continue
		}
		others = append(others, ej)
	}
	return owner, others, false
}

// reconcile brings one job's pods, spec and status in line; after > 0 asks
// to be called again then.
func (c *Controller) reconcile(ctx context.Context, job string) (after time.Duration, err error) {
	var objs []*v1alpha1.ElasticJob
	idx, _ := c.jobs.GetIndexer().ByIndex(byJob, job)
	for _, o := range idx {
		objs = append(objs, o.(*v1alpha1.ElasticJob).DeepCopy())
	}
	if done, err := c.refuseBadName(ctx, job, objs); done || err != nil {
		return 0, err
	}
	spec, err := c.store.Job(ctx, job)
	if errors.Is(err, fleet.ErrNotFound) {
		spec, err = nil, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read job %s's spec: %w", job, err)
	}
	owner, others, foreign := claim(objs, spec)
	for _, ej := range others {
		why := fmt.Errorf("job name %q is taken by ElasticJob %s: job names are unique across namespaces and teams; rename this one", job, ownerName(owner))
		if foreign {
			why = fmt.Errorf("job name %q is taken by a job of team %q submitted with elasticctl: job names are unique across namespaces and teams; rename this one", job, spec.Team)
		}
		if ej.Status.Reason != CodeNameTaken {
			c.recorder.Event(ej, corev1.EventTypeWarning, CodeNameTaken, why.Error())
		}
		if err := c.writeStatus(ctx, ej, StatusInput{Invalid: why, InvalidCode: CodeNameTaken}, nil); err != nil {
			return 0, err
		}
		if err := c.releaseFinalizer(ctx, ej); err != nil {
			return 0, err
		}
	}
	if owner == nil {
		if spec != nil && !foreign {
			// Its ElasticJob is gone (deleted while no controller ran).
			c.log.Info("deleting the spec of a job whose ElasticJob is gone", "job", job, "owner", spec.Run.Env[OwnerEnv])
			if err := c.store.DeleteJob(ctx, job); err != nil && !errors.Is(err, fleet.ErrNotFound) {
				return 0, err
			}
		}
		return 0, nil
	}
	return c.reconcileOwned(ctx, owner, spec)
}

func ownerName(ej *v1alpha1.ElasticJob) string {
	if ej == nil {
		return "?"
	}
	return ej.Namespace + "/" + ej.Name
}

func (c *Controller) reconcileOwned(ctx context.Context, ej *v1alpha1.ElasticJob, spec *fleet.JobSpec) (time.Duration, error) {
	job := ej.Name
	deleting := ej.DeletionTimestamp != nil
	if !deleting && !hasFinalizer(ej) {
		ej.Finalizers = append(ej.Finalizers, Finalizer)
		updated, err := c.crd.ElasticJobs(ej.Namespace).Update(ctx, ej, metav1.UpdateOptions{})
		if err != nil {
			return 0, fmt.Errorf("add the finalizer to %s/%s: %w", ej.Namespace, ej.Name, err)
		}
		ej = updated
	}
	want, invalid := Translate(ej)
	want.RequestedBy = RequestedBy(ej)
	in := StatusInput{Invalid: invalid, Now: c.cfg.Now()}
	switch {
	case deleting:
		if spec != nil {
			if err := c.store.DeleteJob(ctx, job); err != nil && !errors.Is(err, fleet.ErrNotFound) {
				return 0, err
			}
			c.recorder.Event(ej, corev1.EventTypeNormal, "Deleting", "the job's spec is deleted; its pods drain and go")
		}
	case invalid != nil:
		c.recorder.Event(ej, corev1.EventTypeWarning, string(api.CodeInvalidSpec), invalid.Error())
	case spec == nil:
		c.teamFirst(ctx, want.Team)
		if err := c.store.SubmitJob(ctx, want); err != nil {
			return 0, fmt.Errorf("submit job %s: %w", job, err)
		}
		c.recorder.Eventf(ej, corev1.EventTypeNormal, "Submitted", "job %s submitted to team %s (%d..%d nodes)", job, want.Team, want.MinNodes, want.MaxNodes)
	case !sameSpec(*spec, want):
		if _, err := c.store.UpdateJob(ctx, job, func(s *fleet.JobSpec) error {
			t := s.SubmitTime
			*s = want
			s.SubmitTime = t
			return nil
		}); err != nil {
			return 0, fmt.Errorf("update job %s: %w", job, err)
		}
		c.recorder.Event(ej, corev1.EventTypeNormal, "Updated", "the job's spec changed; the coordinator decides again")
	}
	desired, err := c.store.Desired(ctx, job)
	if err != nil {
		c.log.Warn("unreadable desired record; treating the job as unallocated", "job", job, "err", err)
		desired = nil
	}
	in.Desired = desired
	// The status record, or the status the desired record read above
	// implies (a job running as admitted has no status record).
	if st, err := c.store.StatusRecord(ctx, job); err == nil {
		in.Decision = fleet.StatusOf(st, desired)
	}
	fin, _, err := c.store.Finished(ctx)
	if err != nil {
		return 0, err
	}
	if f, ok := fin[job]; ok {
		in.Finish = &f
	}
	canCreate, err := c.ensureSecret(ctx, ej)
	if err != nil {
		return 0, err
	}
	var pods []*corev1.Pod
	objs, _ := c.pods.GetIndexer().ByIndex(byJob, job)
	for _, o := range objs {
		if p := o.(*corev1.Pod); p.Namespace == ej.Namespace {
			pods = append(pods, p)
		}
	}
	c.mu.Lock()
	for _, p := range pods {
		v := ViewOf(p, trainerName(p), c.drainSince[p.UID])
		v.Kept = c.kept[p.UID]
		in.Pods = append(in.Pods, v)
	}
	c.mu.Unlock()
	grace := time.Duration(want.Run.GracefulTimeoutSeconds*float64(time.Second)) + c.cfg.DrainMargin
	busy, wait := c.busyNodes(job, in.Now)
	pin := PlanInput{Desired: desired, Pods: in.Pods, Finished: in.Finish != nil, Deleting: deleting || invalid != nil && spec == nil,
		CanCreate: canCreate && invalid == nil, Grace: grace, Now: in.Now, Busy: busy}
	if invalid == nil {
		c.readRestarts(ctx, job, want.Run.MaxRestarts, &pin, &in)
	}
	after := wait
	var podErr error
	for _, a := range Plan(pin) {
		if err := c.act(ctx, ej, want, desired, pods, a); err != nil {
			if a.Kind != CreatePod || ctx.Err() != nil {
				return 0, err
			}
			// Refused by the API server: the status says why at once;
			// the job is retried.
			in.PodError, podErr = errors.Unwrap(err), err
			continue
		}
		if a.Kind == StartDrain {
			after = grace
		}
		if a.Kind == KeepPod && (after == 0 || after > time.Second) {
			after = time.Second // its replacement, after the backoff
		}
	}
	for _, v := range in.Pods {
		if !v.DrainSince.IsZero() && !v.Ended() && !v.Deleting {
			left := max(grace-in.Now.Sub(v.DrainSince), time.Second)
			if after == 0 || left < after {
				after = left
			}
		}
	}
	if deleting {
		if len(pods) == 0 {
			return 0, c.releaseFinalizer(ctx, ej)
		}
		return max(after, time.Second), nil
	}
	return after, errors.Join(c.writeStatus(ctx, ej, in, nil), podErr)
}

// readRestarts reads the job's restart count (whether its budget of maxR
// is spent) and hyperpodrun's record of its restarts (the status shows a
// recent one as Restarting); an unreadable one is left out.
func (c *Controller) readRestarts(ctx context.Context, job string, maxR int, pin *PlanInput, in *StatusInput) {
	if n, _, err := c.store.Restarts(ctx, job); err == nil {
		pin.RestartsSpent, in.Restarts = n > int64(maxR), n
	}
	if wr, err := c.store.WorkerRestarts(ctx, job); err == nil && wr != nil {
		wr.MaxRestarts = maxR
		in.WorkerRestarts = wr
	}
}

func hasFinalizer(ej *v1alpha1.ElasticJob) bool {
	for _, f := range ej.Finalizers {
		if f == Finalizer {
			return true
		}
	}
	return false
}

// releaseFinalizer removes the finalizer (and the job's Secret).
func (c *Controller) releaseFinalizer(ctx context.Context, ej *v1alpha1.ElasticJob) error {
	if !hasFinalizer(ej) {
		return nil
	}
	if ej.DeletionTimestamp != nil {
		err := c.kube.CoreV1().Secrets(ej.Namespace).Delete(ctx, CredsSecret(ej.Name), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete job %s's credentials Secret: %w", ej.Name, err)
		}
		c.mu.Lock()
		delete(c.secrets, ej.Name)
		c.mu.Unlock()
	}
	var keep []string
	for _, f := range ej.Finalizers {
		if f != Finalizer {
			keep = append(keep, f)
		}
	}
	ej.Finalizers = keep
	if _, err := c.crd.ElasticJobs(ej.Namespace).Update(ctx, ej, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the finalizer of %s/%s: %w", ej.Namespace, ej.Name, err)
	}
	return nil
}

// sameSpec compares specs as the coordinator sees them (the submit time
// stays as first written).
func sameSpec(a, b fleet.JobSpec) bool {
	a.SubmitTime, b.SubmitTime = time.Time{}, time.Time{}
	a.RequestedBy, b.RequestedBy = "", "" // who changed it is no change
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb) // as stored: an empty list is no list
}

// ensureSecret writes the job's Secret (etcd credentials, CA) when it is
// needed and changed; ready says the job's pods can be created.
func (c *Controller) ensureSecret(ctx context.Context, ej *v1alpha1.ElasticJob) (ready bool, err error) {
	data := map[string][]byte{}
	if c.cfg.CACert != nil {
		data["ca.crt"] = c.cfg.CACert
	}
	if c.cfg.Auth {
		creds, err := c.store.Creds(ctx, ej.Name)
		if err != nil {
			return false, err
		}
		if creds == nil {
			return false, nil // the coordinator mints them before it places the job
		}
		data["user"], data["password"] = []byte(creds.User), []byte(creds.Password+"\n")
	}
	if len(data) == 0 {
		return true, nil
	}
	h := sha256.New()
	for _, k := range []string{"ca.crt", "user", "password"} {
		h.Write([]byte(k))
		h.Write(data[k])
	}
	sum := hex.EncodeToString(h.Sum(nil))
	c.mu.Lock()
	same := c.secrets[ej.Name] == sum
	c.mu.Unlock()
	if same {
		return true, nil
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CredsSecret(ej.Name), Namespace: ej.Namespace, Labels: map[string]string{JobLabel: ej.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ElasticJob", Name: ej.Name, UID: ej.UID, Controller: ptr(true)}}},
		Type: corev1.SecretTypeOpaque, Data: data,
	}
	secrets := c.kube.CoreV1().Secrets(ej.Namespace)
	_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		return false, fmt.Errorf("write job %s's credentials Secret: %w", ej.Name, err)
	}
	c.mu.Lock()
	c.secrets[ej.Name] = sum
	c.mu.Unlock()
	return true, nil
}

// act carries out one step of a plan.
func (c *Controller) act(ctx context.Context, ej *v1alpha1.ElasticJob, spec fleet.JobSpec, desired *fleet.Desired, pods []*corev1.Pod, a Action) error {
	typ := corev1.EventTypeNormal
	if a.Warning {
		typ = corev1.EventTypeWarning
	}
	var pod *corev1.Pod
	for _, p := range pods {
		if p.Name == a.Pod {
			pod = p
		}
	}
	switch a.Kind {
	case CreatePod:
		o := PodOptions{Endpoints: c.cfg.PodEndpoints, Prefix: c.store.Keys.Prefix(), LauncherImage: c.cfg.LauncherImage,
			Creds: c.cfg.Auth, CACert: c.cfg.CACert != nil, Generation: desired.Generation}
		p, err := c.kube.CoreV1().Pods(ej.Namespace).Create(ctx, PodFor(ej, spec, a.Node, o), metav1.CreateOptions{})
		if err != nil {
			c.recorder.Eventf(ej, corev1.EventTypeWarning, "PodFailed", "cannot create the pod for node %s: %v", a.Node, err)
			return fmt.Errorf("create job %s's pod on node %s: %w", ej.Name, a.Node, err)
		}
		c.recorder.Eventf(ej, typ, a.Reason, "pod %s: %s", p.Name, a.Why)
		// Wait for the informer to see it before planning again, so a
		// second pod is not created for the node.
		c.waitSeen(ctx, p)
	case DeletePod:
		if pod == nil {
			return nil
		}
		if a.Reason == ReasonNodeFailure && a.Warning {
			c.failed(ej.Name, a.Node, c.cfg.Now().Sub(pod.CreationTimestamp.Time))
		}
		c.mu.Lock()
		c.deletedByUs[pod.UID] = true
		c.mu.Unlock()
		err := c.kube.CoreV1().Pods(ej.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", pod.Name, err)
		}
		c.recorder.Event(ej, typ, a.Reason, a.Why)
	case KeepPod:
		if pod == nil {
			return nil
		}
		c.failed(ej.Name, a.Node, c.cfg.Now().Sub(pod.CreationTimestamp.Time))
		c.mu.Lock()
		c.kept[pod.UID] = true
		c.mu.Unlock()
		c.recorder.Event(ej, typ, a.Reason, a.Why)
	case StartDrain:
		if pod == nil {
			return nil
		}
		c.mu.Lock()
		c.drainSince[pod.UID] = c.cfg.Now()
		c.mu.Unlock()
		c.recorder.Event(ej, typ, a.Reason, a.Why)
	case Finish:
		// The controller is a control-plane component: it writes the
		// finish record itself (nodes only report theirs).
		if err := c.store.RecordFinish(ctx, ej.Name, fleet.Finish{Outcome: a.Outcome, Node: a.Node, Message: a.Why, Time: c.cfg.Now()}); err != nil {
			return err
		}
		c.recorder.Event(ej, typ, a.Reason, a.Why)
	}
	return nil
}

// waitSeen waits (briefly) until the pod informer has p.
func (c *Controller) waitSeen(ctx context.Context, p *corev1.Pod) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, ok, _ := c.pods.GetIndexer().GetByKey(p.Namespace + "/" + p.Name); ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeStatus updates the ElasticJob's status when it changed.
func (c *Controller) writeStatus(ctx context.Context, ej *v1alpha1.ElasticJob, in StatusInput, _ any) error {
	if in.Now.IsZero() {
		in.Now = c.cfg.Now()
	}
	s := ComputeStatus(ej, ej.Status, in)
	if reflect.DeepEqual(s, ej.Status) {
		return nil
	}
	if s.Phase != ej.Status.Phase {
		c.log.Info("job phase", "job", ej.Namespace+"/"+ej.Name, "from", ej.Status.Phase, "to", s.Phase, "reason", s.Reason)
		c.phaseEvent(ej, s)
	}
	ej.Status = s
	if _, err := c.crd.ElasticJobs(ej.Namespace).UpdateStatus(ctx, ej, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // a newer object is on its way through the informer
		}
		return fmt.Errorf("update %s/%s's status: %w", ej.Namespace, ej.Name, err)
	}
	return nil
}
