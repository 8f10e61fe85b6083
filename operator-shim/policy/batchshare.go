package policy

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// BatchConfig is an AWS Batch fair-share scheduling policy. Each team is
// a share identifier; its weightFactor is 1 / Team.Weight (AWS Batch: a
// lower weight factor gets more of the compute: 0.125 gets eight times
// the resources of 1).
type BatchConfig struct {
	// ShareDecay is shareDecaySeconds: the window over which past usage
	// counts (0: only current usage).
	ShareDecay time.Duration `json:"shareDecay,omitempty"`
	// ComputeReservation (0-99) holds back (computeReservation/100)^active
	// of the accelerators for share identifiers that are not active (have
	// no job queued or running), where active counts the active ones.
	ComputeReservation int `json:"computeReservation,omitempty"`
}

// BatchUsage is each share identifier's (team's) decayed usage in
// accelerator-seconds: usage of running and recently finished jobs, each
// second's usage weighing exp(-age / ShareDecay).
type BatchUsage map[string]float64

// DecayUsage is usage after dt more seconds in which allocs ran: the old
// usage decays by exp(-dt / decay) and the allocations' accelerator-seconds
// are added (decayed from the middle of the interval). With decay 0 the
// usage stays empty (only current usage counts). It is pure: usage is not
// changed.
func DecayUsage(usage BatchUsage, allocs []Allocation, dt float64, decay time.Duration) BatchUsage {
	out := BatchUsage{}
	d := decay.Seconds()
	if d <= 0 || dt < 0 {
		return out
	}
	f := math.Exp(-dt / d)
	for t, u := range usage {
		if v := u * f; v > 1e-6 {
			out[t] = v
		}
	}
	mid := math.Exp(-dt / (2 * d))
	for _, a := range allocs {
		out[a.Team] += float64(a.Size*a.AcceleratorsPerNode) * dt * mid
	}
	return out
}

// BatchFairShare is one AWS Batch fair-share dispatch over st (as
// documented for fair-share job queues): jobs run at a static size and are
// never preempted. Jobs are dispatched one at a time from the share
// identifier with the lowest weighted usage, (usage / ShareDecay + the
// accelerators it runs now) x weightFactor, within a share by
// schedulingPriority (Job.Priority) then submission order. A share's first
// job that does not fit blocks that share (head of line) for this
// dispatch; other shares go on. usage is the decayed usage from
// DecayUsage (nil: none).
func BatchFairShare(st State, bc BatchConfig, usage BatchUsage) Decision {
	c := newCycle(st)
	queues := map[string][]*bjob{}
	for _, j := range c.pending() {
		if !c.placeable(j) {
			j.reject(CodeQuotaExceeded, fmt.Sprintf("needs %d accelerators, more than the compute environment can place", j.gpus))
			continue
		}
		queues[j.team] = append(queues[j.team], j)
	}
	cur := map[string]int{}
	capacity := map[string]int{}
	used := map[string]int{}
	active := map[string]bool{}
	for _, j := range c.jobs {
		if j.running {
			cur[j.team] += j.gpus
			used[j.flavor] += j.gpus
		}
		if j.schedulable() {
			active[j.team] = true
		}
	}
	for f, ns := range c.nodes {
		for _, n := range ns {
			capacity[f] += n.accel
		}
	}
	reserved := 0.0
	if bc.ComputeReservation > 0 && len(active) < len(c.teams) {
		reserved = math.Pow(float64(min(bc.ComputeReservation, 99))/100, float64(len(active)))
	}
	score := func(team string) float64 {
		s := float64(cur[team])
		if d := bc.ShareDecay.Seconds(); d > 0 {
			s += usage[team] / d
		}
		w := 1.0
		if t := c.teams[team]; t != nil && t.Weight > 0 {
			w = t.Weight
		}
		return s / w
	}
	teams := make([]string, 0, len(queues))
	for t := range queues {
		teams = append(teams, t)
	}
	for {
		sort.SliceStable(teams, func(a, b int) bool {
			sa, sb := score(teams[a]), score(teams[b])
			if sa != sb {
				return sa < sb
			}
			return teams[a] < teams[b]
		})
		admitted := false
		for _, t := range teams {
			q := queues[t]
			if len(q) == 0 {
				continue
			}
			j := q[0]
			nodes := c.place(j)
			if nodes == nil {
				j.reason.Code, j.reason.Message = CodeNoCapacity, "waiting: no free capacity for the share's next job"
				continue
			}
			if float64(used[j.flavor]+j.gpus) > float64(capacity[j.flavor])*(1-reserved)+1e-9 {
				j.reason.Code, j.reason.Message = CodeReserved, "waiting: compute reservation for inactive share identifiers"
				continue
			}
			c.start(j, nodes, CodeFairShare, fmt.Sprintf("dispatched by fair share (share %s)", t))
			cur[t] += j.gpus
			used[j.flavor] += j.gpus
			queues[t] = q[1:]
			admitted = true
			break
		}
		if !admitted {
			break
		}
	}
	for _, q := range queues {
		for _, j := range q[min(1, len(q)):] {
			if j.reason.Code == "" {
				j.reason.Code, j.reason.Message = CodeStrictFIFO, "waiting behind the share's next job"
			}
		}
	}
	return c.decision()
}
