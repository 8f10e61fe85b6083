package policy

// Schedule runs one engine cycle. It is a pure function of st.
//
// The phases below apply the rules of the package documentation in order;
// each lives in its own file and records the outcome of the jobs it decides
// (outcome.go), which decide renders into the Decision.
func Schedule(st State) Decision {
	s, d := schedule(st)
	putJobs(s.jobs)
	return d
}

// schedule runs the cycle and returns its runtime records with the
// Decision (Engine keeps them).
func schedule(st State) (*sched, Decision) {
	s := &sched{
		now:    st.Now,
		cfg:    st.Config,
		stable: st.Config.StablePeriod(),
		strict: st.Config.Queueing == StrictFIFO,
	}
	s.build(st)                 // build.go: validate and index the input
	s.carryOver(st.Allocations) // carryover.go: rule 1, keep the allocations
	for _, f := range s.flavors {
		s.repair(f)             // carryover.go: rule 1, replace lost nodes
		s.buildQueues(f)        // admit.go: the pending queues
		s.admitWithinNominal(f) // admit.go: rule 2
		s.reclaim(f)            // reclaim.go: rule 3 (defrag.go: 3b)
		s.reserve(f)            // reserve.go: rule 4
		s.admitBorrowing(f)     // admit.go: rule 5
		s.priorityPreempt(f)    // preempt.go: rule 6
		if !s.cfg.DisableGrowth {
			s.grow(f) // grow.go: rule 7
		}
	}
	d := s.decide() // decision.go, explain.go
	return s, d
}

// flavor returns the runtime record of flavor name, creating it.
func (s *sched) flavor(name string) *flavorRT {
	if f, ok := s.flavorByNm[name]; ok {
		return f
	}
	f := &flavorRT{name: name, cohorts: map[string]*cohortRT{}, failMemo: map[memoKey]int{}}
	s.flavorByNm[name] = f
	s.flavors = append(s.flavors, f)
	return f
}

// problem reports bad input.
func (s *sched) problem(obj, name string, err error) {
	s.problems = append(s.problems, Problem{Object: obj, Name: name, Error: err.Error()})
}
