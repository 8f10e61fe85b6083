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
		if j.nextSize(j.size) == 0 {
			j.blockGrowth(CodeAtMax)
			continue
		}
		if !j.admitted() && s.stable > 0 && s.now.Sub(j.lastResize) < s.stable {
			j.blockGrowth(CodeStablePeriod)
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

// growStep grows j by one step if quota and nodes allow, else records why not.
func (s *sched) growStep(j *jobRT) bool {
	nx := j.nextSize(j.size)
	if nx == 0 {
		j.blockGrowth(CodeAtMax)
		return false
	}
	d := nx - j.size
	tf := j.tf
	acc := d * j.per
	if c := s.quotaCheck(tf, acc, d*j.vcpu, int64(d)*j.mem, false); c != "" {
		j.blockGrowth(c)
		return false
	}
	nodes := s.findNodes(j, d)
	if nodes == nil {
		j.blockGrowth(CodeNoCapacity)
		return false
	}
	for _, n := range nodes {
		s.attach(j, n)
	}
	j.setGrown(tf.used > tf.nominal)
	j.lastResize = s.now
	return true
}
