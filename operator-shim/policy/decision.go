package policy

import "slices"

// decide assembles the Decision.
func (s *sched) decide() Decision {
	d := Decision{Now: s.now, Problems: s.problems}
	if len(s.released) > 0 {
		d.Released = slices.Clone(s.released)
		slices.Sort(d.Released)
	}
	cache := map[*flavorRT]*holders{}
	d.Reasons = make([]Reason, 0, withRoom(len(s.jobs)))
	placed := 0
	for i := range s.jobs {
		if s.jobs[i].size > 0 {
			placed++
		}
	}
	if placed > 0 {
		d.Allocations = make([]Allocation, 0, withRoom(placed))
	}
	for i := range s.jobs {
		j := &s.jobs[i]
		d.Reasons = append(d.Reasons, s.reason(j, cache))
		if j.size == 0 {
			continue
		}
		d.Allocations = append(d.Allocations, allocation(j))
	}
	for i := range s.teams {
		t := &s.teams[i]
		if !t.valid {
			continue
		}
		names := make([]string, 0, len(t.flavors))
		for n := range t.flavors {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			tf := t.flavors[n]
			u := TeamUsage{Team: t.name, Cohort: t.cohort, Flavor: n, Nominal: tf.nominal, Used: tf.used,
				Borrowed: max(0, tf.used-tf.nominal), Running: tf.running}
			for _, j := range tf.jobs {
				if j.size == 0 && !j.spec.Suspended {
					u.Pending++
					u.PendingAccelerators += j.per * j.sp.min
				}
			}
			d.Teams = append(d.Teams, u)
		}
	}
	return d
}

// allocation is the placed job j's Allocation: its node list is the one it
// was given where it kept those nodes.
func allocation(j *jobRT) Allocation {
	a := Allocation{
		Job: j.name, Team: j.team.name, Flavor: j.flavor, Size: j.size,
		AcceleratorsPerNode: j.per, Since: j.since, LastResize: j.lastResize,
	}
	if len(j.tookFrom) > 0 {
		a.TookFrom = slices.Clone(j.tookFrom)
		slices.Sort(a.TookFrom)
	}
	same := len(j.prevNodes) == j.size
	for k := 0; same && k < j.size; k++ {
		same = j.prevNodes[k] == j.nodes[k].name
	}
	if same {
		a.Nodes = j.prevNodes
	} else {
		a.Nodes = make([]string, j.size)
		for k, n := range j.nodes {
			a.Nodes[k] = n.name
		}
	}
	return a
}
