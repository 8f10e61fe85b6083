package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// TeamFrom is an ElasticTeam as the coordinator's team record (what
// elasticctl apply -f teams.yaml writes).
func TeamFrom(et *v1alpha1.ElasticTeam) (api.Team, error) {
	t := api.Team{Name: et.Name, Cohort: et.Spec.Cohort, Preemption: api.PreemptionPolicy(et.Spec.Preemption), Quotas: []api.FlavorQuota{}}
	if w := et.Spec.Weight; w != "" {
		v, err := strconv.ParseFloat(w, 64)
		if err != nil {
			return t, fmt.Errorf("spec.weight: %q is not a number", w)
		}
		t.Weight = v
	}
	for _, q := range et.Spec.Quotas {
		fq := api.FlavorQuota{Flavor: q.Flavor, Nominal: int(q.Nominal)}
		if q.BorrowingLimit != nil {
			v := int(*q.BorrowingLimit)
			fq.BorrowingLimit = &v
		}
		if q.LendingLimit != nil {
			v := int(*q.LendingLimit)
			fq.LendingLimit = &v
		}
		t.Quotas = append(t.Quotas, fq)
	}
	if err := t.Validate(); err != nil {
		return t, fmt.Errorf("spec: %w", err)
	}
	return t, nil
}

// bridgeTeams applies ElasticTeams to the team records: a team declared
// in Kubernetes is owned by it (the controller rewrites a record that
// differs, e.g. after an elasticctl apply), and deleting the ElasticTeam
// deletes the record it wrote.
func (c *Controller) bridgeTeams(ctx context.Context) {
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(c.crd.RESTClient(), v1alpha1.ElasticTeams, metav1.NamespaceAll, fields.Everything()),
		&v1alpha1.ElasticTeam{}, 0, cache.Indexers{})
	work := make(chan *v1alpha1.ElasticTeam, 64)
	gone := make(chan *v1alpha1.ElasticTeam, 64)
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { work <- o.(*v1alpha1.ElasticTeam) },
		UpdateFunc: func(_, o any) { work <- o.(*v1alpha1.ElasticTeam) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if et, ok := o.(*v1alpha1.ElasticTeam); ok {
				gone <- et
			}
		},
	})
	go inf.Run(ctx.Done())
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case et := <-work:
			c.applyTeam(ctx, et)
		case et := <-gone:
			c.deleteTeam(ctx, et)
		case <-tick.C:
			for _, o := range inf.GetStore().List() {
				c.applyTeam(ctx, o.(*v1alpha1.ElasticTeam))
			}
		}
	}
}

func (c *Controller) applyTeam(ctx context.Context, et *v1alpha1.ElasticTeam) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := v1alpha1.ElasticTeamStatus{Applied: true, ObservedGeneration: et.Generation}
	t, err := TeamFrom(et)
	if err == nil {
		cur, gerr := c.store.Team(ctx, et.Name)
		switch {
		case gerr == nil && reflect.DeepEqual(*cur, t):
		case gerr == nil || errors.Is(gerr, fleet.ErrNotFound):
			if err = c.store.PutTeam(ctx, t); err == nil {
				c.log.Info("team applied from its ElasticTeam", "team", t.Name)
			}
		default:
			err = gerr
		}
	}
	if err != nil {
		st = v1alpha1.ElasticTeamStatus{Message: err.Error(), ObservedGeneration: et.Generation}
	}
	if reflect.DeepEqual(st, et.Status) {
		return
	}
	u := et.DeepCopy()
	u.Status = st
	if _, err := c.crd.ElasticTeams().UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		c.log.Warn("cannot update an ElasticTeam's status", "team", et.Name, "err", err)
	}
}

func (c *Controller) deleteTeam(ctx context.Context, et *v1alpha1.ElasticTeam) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, err := TeamFrom(et)
	if err != nil {
		return
	}
	cur, err := c.store.Team(ctx, et.Name)
	if err != nil || !reflect.DeepEqual(*cur, t) {
		return // not the record it wrote
	}
	if _, err := c.cfg.Etcd.Delete(ctx, c.store.Keys.Team(et.Name)); err != nil {
		c.log.Warn("cannot delete the team record of a deleted ElasticTeam", "team", et.Name, "err", err)
		return
	}
	c.log.Info("team record deleted with its ElasticTeam", "team", et.Name)
}

// teamFirst applies a new job's ElasticTeam before the job is submitted
// when the team's record is not in etcd yet (the team bridge has not run
// since a start, or the record was deleted): else the coordinator would
// find the team missing and say so, though the ElasticTeam exists.
func (c *Controller) teamFirst(ctx context.Context, team string) {
	if !c.cfg.Teams {
		return
	}
	if _, err := c.store.Team(ctx, team); !errors.Is(err, fleet.ErrNotFound) {
		return
	}
	et, err := c.crd.ElasticTeams().Get(ctx, team, metav1.GetOptions{})
	if err != nil {
		return // none (the coordinator says the team is missing), or the next resync applies it
	}
	c.applyTeam(ctx, et)
}
