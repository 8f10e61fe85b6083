package policy

// Schedule runs one engine cycle. It is a pure function of st.
func Schedule(st State) Decision {
	s := &sched{
		now:    st.Now,
		cfg:    st.Config,
		stable: st.Config.stablePeriod(),
		strict: st.Config.Queueing == StrictFIFO,
	}
	s.build(st)
	s.carryOver(st.Allocations)
	for _, f := range s.flavors {
		s.repair(f)
		s.finishSetup(f)
		s.admitWithinNominal(f)
		s.reclaim(f)
		s.reserve(f)
		s.admitBorrowing(f)
		s.priorityPreempt(f)
		if !s.cfg.DisableGrowth {
			s.grow(f)
		}
	}
	return s.decide()
}

func (s *sched) flavor(name string) *flavorRT {
	if f, ok := s.flavorByNm[name]; ok {
		return f
	}
	f := &flavorRT{name: name, cohorts: map[string]*cohortRT{}, failMemo: map[memoKey]int{}}
	s.flavorByNm[name] = f
	s.flavors = append(s.flavors, f)
	return f
}

func (s *sched) problem(obj, name string, err error) {
	s.problems = append(s.problems, Problem{Object: obj, Name: name, Error: err.Error()})
}
