// Command elasticctl submits, inspects, explains and resizes elastic jobs,
// manages teams and quotas, and simulates the fair-share policy on traces.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func ctxOf(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, 15*time.Second)
}

// jobView is a job with its state, for get/describe.
type jobView struct {
	Spec       *fleet.JobSpec     `json:"spec"`
	Allocation *policy.Allocation `json:"allocation,omitempty"`
	Status     *fleet.Status      `json:"status,omitempty"`
	Finished   *fleet.Finish      `json:"finished,omitempty"`
	// Problems are why nodes cannot run the job right now (describe only).
	Problems []fleet.Problem `json:"problems,omitempty"`
	// WorkerRestarts are the restarts hyperpodrun made after worker
	// failures, with the last failure (describe, and a running job's
	// listing row: Restarting while they are recent).
	WorkerRestarts *fleet.WorkerRestarts `json:"workerRestarts,omitempty"`
}

func (v jobView) state() string {
	switch {
	case v.Finished != nil:
		return v.Finished.Outcome
	case v.Status != nil:
		return string(v.Status.Kind)
	}
	return "Submitted"
}

func (v jobView) size() int {
	if v.Allocation != nil {
		return v.Allocation.Size
	}
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func limit(l *int) string {
	if l == nil {
		return "none"
	}
	return fmt.Sprint(*l)
}

// eventLine renders an event from the point of view of job (or neutrally).
func eventLine(e fleet.Event, job string) string {
	if job != "" && e.Job != job {
		return fmt.Sprintf("took capacity from %s (%s %d -> %d): %s", e.Job, e.Kind, e.FromSize, e.ToSize, e.Message)
	}
	line := fmt.Sprintf("%s %s", e.Kind, e.Job)
	if e.FromSize != e.ToSize {
		line += fmt.Sprintf(" %d -> %d nodes", e.FromSize, e.ToSize)
	}
	line += ": " + e.Message
	if len(e.For) > 0 {
		line += fmt.Sprintf(" [for %s of team %s]", strings.Join(e.For, ","), e.ForTeam)
	}
	return line
}

func cmdResize(c *cli.Context, st *query.Store) error {
	if c.Args().First() != "job" || c.Args().Get(1) == "" {
		return usageError{errors.New("usage: elasticctl resize job NAME [--min N] [--max N] [--nodes N]")}
	}
	if !c.IsSet("min") && !c.IsSet("max") && !c.IsSet("nodes") {
		return usageError{errors.New("resize: give --min, --max or --nodes")}
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	for _, f := range []string{"nodes", "min", "max"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return usageError{fmt.Errorf("resize: --%s must be >= 1 (got %d); to stop the job, use 'elasticctl suspend %s'", f, c.Int(f), c.Args().Get(1))}
		}
	}
	by := requester(c)
	j, err := st.UpdateJob(ctx, c.Args().Get(1), func(j *fleet.JobSpec) error {
		j.RequestedBy = by
		if ns, name, ok := j.KubernetesOwner(); ok {
			return fmt.Errorf("resize: job %s belongs to ElasticJob %s/%s of Kubernetes, whose controller would put elasticctl's change back: resize it with 'kubectl scale elasticjob %s -n %s --replicas=N' (sets spec.elasticPolicy.maxReplicas) or 'kubectl edit elasticjob %s -n %s'", j.Name, ns, name, name, ns, name, ns)
		}
		lo, hi := j.Bounds()
		if c.IsSet("nodes") {
			lo, hi = c.Int("nodes"), c.Int("nodes")
		}
		if c.IsSet("min") {
			lo = c.Int("min")
		}
		if c.IsSet("max") {
			hi = c.Int("max")
		}
		j.MinNodes, j.MaxNodes = lo, hi
		if len(j.Sizes) > 0 {
			// A job with discrete sizes keeps those within the new bounds.
			var kept []int
			for _, z := range j.Sizes {
				if z >= lo && z <= hi {
					kept = append(kept, z)
				}
			}
			if len(kept) == 0 {
				return usageError{fmt.Errorf("resize: none of job %s's allowed sizes %v is within %d..%d nodes", j.Name, j.Sizes, lo, hi)}
			}
			j.Sizes, j.MinNodes, j.MaxNodes = kept, kept[0], kept[len(kept)-1]
		}
		if err := j.Validate(policy.Config{}); err != nil {
			return usageError{fmt.Errorf("resize: %w", err)}
		}
		return nil
	})
	if err != nil {
		return jobErr(c.Args().Get(1), err)
	}
	lo, hi := j.Bounds()
	if len(j.Sizes) > 0 {
		fmt.Fprintf(c.App.Writer, "job/%s resized to %d..%d nodes (sizes %v)\n", j.Name, lo, hi, j.Sizes)
		return nil
	}
	fmt.Fprintf(c.App.Writer, "job/%s resized to %d..%d nodes\n", j.Name, lo, hi)
	return nil
}

func setSuspended(v bool) action {
	return func(c *cli.Context, st *query.Store) error {
		name := c.Args().First()
		if name == "" {
			return usageError{errors.New("give the job name")}
		}
		if err := nameArg(c, "job", name); err != nil {
			return err
		}
		ctx, cancel := ctxOf(c)
		defer cancel()
		by := requester(c)
		if _, err := st.UpdateJob(ctx, name, func(j *fleet.JobSpec) error {
			if ns, ejName, ok := j.KubernetesOwner(); ok {
				return kubeSuspendRefusal(name, ns, ejName, v)
			}
			j.Suspended, j.RequestedBy = v, by
			return nil
		}); err != nil {
			return jobErr(name, err)
		}
		word := "resumed"
		if v {
			word = "suspended"
		}
		fmt.Fprintf(c.App.Writer, "job/%s %s\n", name, word)
		return nil
	}
}

// kubeSuspendRefusal is why elasticctl does not suspend or resume a job the
// Kubernetes controller owns (it would put spec.suspend back), naming the
// kubectl command that does.
func kubeSuspendRefusal(job, ns, ejName string, suspend bool) error {
	verb := "resume"
	if suspend {
		verb = "suspend"
	}
	return fmt.Errorf("%s: job %s belongs to ElasticJob %s/%s of Kubernetes, whose controller would put elasticctl's change back: %s it with: kubectl patch elasticjob %s -n %s --type merge -p '{\"spec\":{\"suspend\":%t}}'", verb, job, ns, ejName, verb, ejName, ns, suspend)
}

// cmdDelete deletes each named job, as kubectl delete does: every name is
// tried, each deleted one is printed, and the names that could not be
// deleted (missing, owned by Kubernetes) are errors after the others went
// (exit 1).
func cmdDelete(c *cli.Context, st *query.Store) error {
	names := c.Args().Slice()
	if len(names) == 0 {
		return usageError{errors.New("give the job name")}
	}
	for _, name := range names {
		if err := nameArg(c, "job", name); err != nil {
			return err
		}
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	var errs []error
	for i, name := range names {
		if slices.Contains(names[:i], name) {
			continue
		}
		if err := deleteJob(ctx, st, name); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(c.App.Writer, "job/%s deleted\n", name)
	}
	return errors.Join(errs...)
}

// deleteJob deletes one job unless the Kubernetes controller owns it.
func deleteJob(ctx context.Context, st *query.Store, name string) error {
	if j, err := st.Job(ctx, name); err == nil {
		if ns, ejName, ok := j.KubernetesOwner(); ok {
			return fmt.Errorf("delete: job %s belongs to ElasticJob %s/%s of Kubernetes, whose controller would submit it again: delete it with 'kubectl delete elasticjob %s -n %s'", name, ns, ejName, ejName, ns)
		}
	}
	if err := st.DeleteJob(ctx, name); err != nil {
		return jobErr(name, err)
	}
	return nil
}

// jobErr words a missing job in the user's terms, with where to look.
func jobErr(name string, err error) error {
	if errors.Is(err, fleet.ErrNotFound) {
		return fmt.Errorf("job %q not found: 'elasticctl get jobs' lists them", name)
	}
	return err
}

// warnAll prints the malformed records a read skipped.
func warnAll(w io.Writer, bad []error) {
	for _, b := range bad {
		fmt.Fprintf(w, "warning: %v\n", b)
	}
}

// weightOf is a team's fair-share weight as the engine uses it (unset: 1).
func weightOf(t policy.Team) float64 {
	if t.Weight > 0 {
		return t.Weight
	}
	return 1
}
