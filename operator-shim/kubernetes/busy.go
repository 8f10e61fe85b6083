package kubernetes

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// busyNodes are the nodes where no pod of job may start now: a pod of
// another job there has not ended yet (it may be draining; a pod pinned
// there now would find the node's accelerators taken and the kubelet would
// refuse it), or the job's last pod there failed and its backoff runs.
// wait is when the earliest backoff ends (0: none).
func (c *Controller) busyNodes(job string, now time.Time) (busy map[string]string, wait time.Duration) {
	busy = map[string]string{}
	c.mu.Lock()
	for k, b := range c.backoff {
		j, node, _ := strings.Cut(k, "\x00")
		if j != job || !now.Before(b.notBefore) {
			continue
		}
		busy[node] = "backoff"
		if d := b.notBefore.Sub(now); wait == 0 || d < wait {
			wait = d
		}
	}
	c.mu.Unlock()
	if c.pods == nil {
		return busy, wait
	}
	for _, o := range c.pods.GetStore().List() {
		p := o.(*corev1.Pod)
		if p.Labels[JobLabel] == job || p.Spec.NodeName == "" {
			continue
		}
		if !ViewOf(p, trainerName(p), time.Time{}).Ended() {
			busy[p.Spec.NodeName] = p.Namespace + "/" + p.Name
		}
	}
	return busy, wait
}

// backoff delays the next pod of a job on a node after failures there: 1s
// doubling to 30s, as the node agent restarts a failed hyperpodrun
// (a pod that ran a minute starts it over).
type backoff struct {
	failures  int
	notBefore time.Time
}

// failed notes a failed pod of job on node that had run for ran.
func (c *Controller) failed(job, node string, ran time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := job + "\x00" + node
	b := c.backoff[k]
	if ran >= time.Minute {
		b.failures = 0
	}
	d := time.Second << min(b.failures, 5)
	b.failures++
	b.notBefore = c.cfg.Now().Add(min(d, 30*time.Second))
	c.backoff[k] = b
}
