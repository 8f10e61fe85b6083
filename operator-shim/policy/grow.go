package policy

// grow is rule 7.
func (s *sched) grow(f *flavorRT) {
	type teamJobs struct {
		tf   *teamFlavor
		jobs *heap[*jobRT]
	}
	byTeam := map[*teamFlavor]*teamJobs{}
	var order []*teamJobs
	for _, j := range f.jobs {
		if !j.spec.Elastic || j.size == 0 || j.yielded() || !j.exclusive {
			continue
		}
		if s.growthBlocked(j) {
			continue
		}
		tj := byTeam[j.tf]
		if tj == nil {
			tj = &teamJobs{tf: j.tf, jobs: newHeap(func(a, b *jobRT) bool {
				if a.sp.prio != b.sp.prio {
					return a.sp.prio > b.sp.prio
				}
				if a.size != b.size {
					return a.size < b.size
				}
				return jobOrder(a, b) < 0
			})}
			byTeam[j.tf] = tj
			order = append(order, tj)
		}
		tj.jobs.push(j)
	}
	th := newHeap(func(a, b *teamJobs) bool { return teamKey(a.tf, b.tf) < 0 })
	for _, tj := range order {
		th.push(tj)
	}
	for th.len() > 0 {
		tj := th.top()
		j := tj.jobs.top()
		if s.growStep(j) {
			tj.jobs.fix(0)
			th.fix(0)
			continue
		}
		tj.jobs.pop()
		if tj.jobs.len() == 0 {
			th.pop()
		}
	}
}

// growthBlocked marks the elastic job j when it may not grow in this cycle,
// at its maximum or (carried over) within its stable period, and reports
// whether it may not.
func (s *sched) growthBlocked(j *jobRT) bool {
	switch {
	case j.nextSize(j.size) == 0:
		j.blockGrowth(CodeAtMax)
	case !j.admitted() && s.stable > 0 && s.now.Sub(j.lastResize) < s.stable:
		j.blockGrowth(CodeStablePeriod)
	default:
		return false
	}
	return true
}

// growStep grows j by one step if quota and nodes allow, else records why not.
func (s *sched) growStep(j *jobRT) bool {
	nx := j.nextSize(j.size)
	if nx == 0 {
		j.blockGrowth(CodeAtMax)
		return false
	}
	code, ok := s.growCheck(j)
	if !ok {
		j.blockGrowth(code)
		return false
	}
	tf := j.tf
	for _, n := range s.scratch {
		s.attach(j, n)
	}
	j.setGrown(tf.used > tf.nominal)
	j.lastResize = s.now
	return true
}

// growCheck reports whether j may grow by one step now (then s.scratch
// holds the nodes), else why not.
func (s *sched) growCheck(j *jobRT) (ReasonCode, bool) {
	nx := j.nextSize(j.size)
	if nx == 0 {
		return CodeAtMax, false
	}
	d := nx - j.size
	if c := s.quotaCheck(j.tf, d*j.per, d*j.vcpu, int64(d)*j.mem, false); c != "" {
		return c, false
	}
	if s.findNodes(j, d) == nil {
		return CodeNoCapacity, false
	}
	return "", true
}
