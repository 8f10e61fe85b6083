package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// MaxTxnOps is etcd's default --max-txn-ops: the most operations (and the
// most comparisons) one transaction may hold. Batched reads and writes stay
// within it.
const MaxTxnOps = 128

// ErrJobsExist is returned (wrapped, naming the jobs) by SubmitJobs when
// a job of the batch exists already.
var ErrJobsExist = errors.New("already exist")

// rollbackTimeout bounds each delete of a failed batch's rollback.
const rollbackTimeout = 5 * time.Second

// SubmitJobs stores new jobs as SubmitJob does, all or none: when they fit
// one transaction (MaxTxnOps) they are written in one; a larger batch is
// written in consecutive transactions, and when one of those fails the
// jobs the earlier ones wrote are deleted again (unless changed since), so
// no partial batch stays. The jobs that exist already are named in the
// error, which wraps ErrJobsExist.
func (s *Store) SubmitJobs(ctx context.Context, jobs []JobSpec) error {
	type written struct {
		key string
		rev int64
	}
	var done []written
	rollback := func() {
		// Even when ctx is what ended the batch; each delete bounded.
		for _, w := range done {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_, _ = s.Cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(w.key), "=", w.rev)).
				Then(clientv3.OpDelete(w.key)).Commit()
			cancel()
		}
	}
	names := make([]string, len(jobs))
	for i, j := range jobs {
		if err := api.ValidateName("job", j.Name); err != nil {
			return err
		}
		if err := api.ValidateName("team", j.Team); err != nil {
			return fmt.Errorf("job %q: %w", j.Name, err)
		}
		names[i] = j.Name
	}
	// Names are unique across teams.
	owners, err := s.specKeys(ctx, names)
	if err != nil {
		return fmt.Errorf("submit jobs: %w", err)
	}
	var taken []string
	for _, j := range jobs {
		if key, ok := owners[j.Name]; ok {
			if t, _, _ := s.Keys.SpecOwner(key); t != j.Team {
				taken = append(taken, fmt.Sprintf("%q (team %q has it)", j.Name, t))
			}
		}
	}
	if len(taken) > 0 {
		return fmt.Errorf("job names are unique across teams and %s %s: nothing was submitted; choose other names: %w",
			strings.Join(taken, ", "), map[bool]string{true: "is taken", false: "are taken"}[len(taken) == 1], ErrJobsExist)
	}
	// wipe: also delete what earlier jobs of these names left, which a
	// team's role may not (auth on); then the batch waits for the
	// coordinator to have forgotten them instead.
	wipe := true
	for i := 0; i < len(jobs); {
		per := MaxTxnOps / (1 + len(s.forgetOps(""))) // put + forgetOps' deletes; or 4 compares
		if !wipe {
			per = MaxTxnOps / (1 + len(s.forgottenCmps("")))
		}
		batch := jobs[i:min(len(jobs), i+per)]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, j := range batch {
			key := s.Keys.Spec(j.Team, j.Name)
			op, err := putOp(key, j)
			if err != nil {
				rollback()
				return err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			ops = append(ops, op)
			if wipe {
				cmps = append(cmps, s.noMembers(j.Name))
				ops = append(ops, s.forgetOps(j.Name)...)
			} else {
				cmps = append(cmps, s.forgottenCmps(j.Name)...)
			}
		}
		r, err := s.Cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if wipe && IsPermissionDenied(err) {
			wipe = false
			continue
		}
		if err != nil {
			rollback()
			return fmt.Errorf("submit jobs: %w", err)
		}
		if !r.Succeeded {
			rollback()
			return s.whyNotSubmitted(ctx, jobs)
		}
		for _, j := range batch {
			done = append(done, written{s.Keys.Spec(j.Team, j.Name), r.Header.Revision})
		}
		i += len(batch)
	}
	return nil
}

// whyNotSubmitted names the jobs of a refused batch that exist, or those
// whose earlier namesake is still leaving its nodes.
func (s *Store) whyNotSubmitted(ctx context.Context, jobs []JobSpec) error {
	var exist, leaving []string
	for i := 0; i < len(jobs); i += MaxTxnOps / 2 {
		batch := jobs[i:min(len(jobs), i+MaxTxnOps/2)]
		var ops []clientv3.Op
		for _, j := range batch {
			ops = append(ops, clientv3.OpGet(s.Keys.Spec(j.Team, j.Name), clientv3.WithCountOnly()),
				clientv3.OpGet(s.Keys.Rdzv(j.Name).Members, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		r, err := s.Cli.Txn(ctx).Then(ops...).Commit()
		if IsPermissionDenied(err) {
			// A team's role may not read jobs/: an earlier job of the
			// name is leaving while the coordinator keeps its desired
			// record (it deletes it once no node is left).
			ops = ops[:0]
			for _, j := range batch {
				ops = append(ops, clientv3.OpGet(s.Keys.Spec(j.Team, j.Name), clientv3.WithCountOnly()),
					clientv3.OpGet(s.Keys.Desired(j.Name), clientv3.WithCountOnly()))
			}
			r, err = s.Cli.Txn(ctx).Then(ops...).Commit()
		}
		if err != nil {
			return fmt.Errorf("submit jobs: %w", err)
		}
		for k, j := range batch {
			switch {
			case r.Responses[2*k].GetResponseRange().Count > 0:
				exist = append(exist, j.Name)
			case r.Responses[2*k+1].GetResponseRange().Count > 0:
				leaving = append(leaving, j.Name)
			}
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("%s %w: nothing was submitted; delete them first, choose other names, or use 'elasticctl apply -f' to update them",
			jobList(exist), ErrJobsExist)
	}
	if len(leaving) > 0 {
		return fmt.Errorf("an earlier job named %s is still leaving its nodes: nothing was submitted; try again in a few seconds", strings.Join(quoteAll(leaving), ", "))
	}
	return errors.New("the jobs changed while they were submitted: nothing was submitted; try again")
}

func quoteAll(names []string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return q
}

func jobList(names []string) string {
	if len(names) == 1 {
		return "job " + strconv.Quote(names[0])
	}
	const shown = 5
	q := quoteAll(names)
	if len(q) > shown {
		return fmt.Sprintf("jobs %s and %d more", strings.Join(q[:shown], ", "), len(q)-shown)
	}
	return "jobs " + strings.Join(q, ", ")
}

// ApplyResult is what ApplyJobs did to one job.
type ApplyResult string

// ApplyJobs results.
const (
	Created   ApplyResult = "created"
	Unchanged ApplyResult = "unchanged"
	Updated   ApplyResult = "configured"
)

// ApplyJobs creates the jobs that do not exist and updates those that do
// (keeping their submit time, so their place in the queue), leaving equal
// ones untouched: applying one file twice changes nothing the second time.
// Each job is written with a compare on its revision (a concurrent change
// is retried). A job's submit time, when the file leaves it out, is the
// stored one, or now for a new job.
func (s *Store) ApplyJobs(ctx context.Context, jobs []JobSpec, now time.Time) ([]ApplyResult, error) {
	res := make([]ApplyResult, len(jobs))
	for i, j := range jobs {
		for {
			if err := api.ValidateName("team", j.Team); err != nil {
				return res, fmt.Errorf("job %q: %w", j.Name, err)
			}
			key := s.Keys.Spec(j.Team, j.Name)
			r, err := s.Cli.Get(ctx, key)
			if err != nil {
				return res, fmt.Errorf("read job %q: %w", j.Name, err)
			}
			if len(r.Kvs) == 0 {
				if j.SubmitTime.IsZero() {
					j.SubmitTime = now
				}
				err := s.SubmitJob(ctx, j)
				if err != nil {
					return res, err
				}
				res[i] = Created
				break
			}
			var old JobSpec
			if err := json.Unmarshal(r.Kvs[0].Value, &old); err != nil {
				old = JobSpec{} // a malformed spec is replaced
			}
			if j.SubmitTime.IsZero() {
				j.SubmitTime = old.SubmitTime
			}
			a, _ := json.Marshal(old)
			b, _ := json.Marshal(j)
			if string(a) == string(b) {
				res[i] = Unchanged
				break
			}
			op, err := putOp(key, j)
			if err != nil {
				return res, err
			}
			tr, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Kvs[0].ModRevision)).Then(op).Commit()
			if err != nil {
				return res, fmt.Errorf("write job %q: %w", j.Name, err)
			}
			if tr.Succeeded {
				res[i] = Updated
				break
			}
		}
	}
	return res, nil
}
