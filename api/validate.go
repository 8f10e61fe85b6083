package api

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// MaxNodeAccelerators bounds Node.Accelerators (sanity check on inventory).
const MaxNodeAccelerators = 4096

// Validate checks a node and returns an error naming the field and the fix.
func (n Node) Validate() error {
	var errs []error
	if n.Name == "" {
		errs = append(errs, errors.New("name: must be set"))
	}
	if n.Flavor == "" {
		errs = append(errs, errors.New("flavor: must be set (e.g. nvidia-h100-80gb, trainium2)"))
	}
	if n.Accelerators < 0 || n.Accelerators > MaxNodeAccelerators {
		errs = append(errs, fmt.Errorf("accelerators: must be between 0 and %d (got %d)", MaxNodeAccelerators, n.Accelerators))
	}
	if n.UnhealthyAccelerators < 0 || n.UnhealthyAccelerators > n.Accelerators {
		errs = append(errs, fmt.Errorf("unhealthyAccelerators: must be between 0 and accelerators (%d) (got %d)", n.Accelerators, n.UnhealthyAccelerators))
	}
	if n.VCPUs < 0 {
		errs = append(errs, fmt.Errorf("vcpus: must be >= 0 (got %d)", n.VCPUs))
	}
	if n.Memory < 0 {
		errs = append(errs, fmt.Errorf("memory: must be >= 0 (got %d)", n.Memory))
	}
	return wrap("node", n.Name, errs)
}

// Validate checks a team and returns an error naming the field and the fix.
func (t Team) Validate() error {
	var errs []error
	if t.Name == "" {
		errs = append(errs, errors.New("name: must be set"))
	} else if err := ValidateName("name", t.Name); err != nil {
		errs = append(errs, err)
	}
	if t.Weight < 0 || math.IsNaN(t.Weight) || math.IsInf(t.Weight, 0) {
		errs = append(errs, fmt.Errorf("weight: must be a positive number (got %v); omit it for 1", t.Weight))
	}
	switch t.Preemption {
	case "", PreemptNever, PreemptLowerPriority:
	default:
		errs = append(errs, fmt.Errorf("preemption: must be %q or %q (got %q)", PreemptNever, PreemptLowerPriority, t.Preemption))
	}
	seen := map[string]bool{}
	for i, q := range t.Quotas {
		p := fmt.Sprintf("quotas[%d]", i)
		if q.Flavor == "" {
			errs = append(errs, fmt.Errorf("%s.flavor: must be set", p))
		} else if seen[q.Flavor] {
			errs = append(errs, fmt.Errorf("%s.flavor: %q listed twice; merge the entries", p, q.Flavor))
		}
		seen[q.Flavor] = true
		if q.Nominal < 0 {
			errs = append(errs, fmt.Errorf("%s.nominal: must be >= 0 (got %d); set it to the accelerators the team is guaranteed", p, q.Nominal))
		}
		if q.BorrowingLimit != nil && *q.BorrowingLimit < 0 {
			errs = append(errs, fmt.Errorf("%s.borrowingLimit: must be >= 0 (got %d); omit it for unlimited", p, *q.BorrowingLimit))
		}
		if q.LendingLimit != nil && (*q.LendingLimit < 0 || *q.LendingLimit > q.Nominal) {
			errs = append(errs, fmt.Errorf("%s.lendingLimit: must be between 0 and nominal (%d) (got %d); omit it to lend all idle quota", p, q.Nominal, *q.LendingLimit))
		}
		if q.VCPUs < 0 {
			errs = append(errs, fmt.Errorf("%s.vcpus: must be >= 0 (got %d)", p, q.VCPUs))
		}
		if q.Memory < 0 {
			errs = append(errs, fmt.Errorf("%s.memory: must be >= 0 (got %d)", p, q.Memory))
		}
	}
	return wrap("team", t.Name, errs)
}

// ResolvePriority returns the job's numeric priority under cfg's classes.
func (j Job) ResolvePriority(cfg Config) (int, error) {
	classes := cfg.Classes()
	switch {
	case j.Priority != nil && j.PriorityClass != "":
		c, ok := classes[j.PriorityClass]
		if !ok || c != *j.Priority {
			return 0, fmt.Errorf("priority and priorityClass: both set and they disagree; set only one")
		}
		return c, nil
	case j.Priority != nil:
		if *j.Priority < 0 || *j.Priority > 99 {
			return 0, fmt.Errorf("priority: must be 0-99 (got %d)", *j.Priority)
		}
		return *j.Priority, nil
	case j.PriorityClass != "":
		c, ok := classes[j.PriorityClass]
		if !ok {
			names := make([]string, 0, len(classes))
			for n := range classes {
				names = append(names, n)
			}
			sort.Strings(names)
			return 0, fmt.Errorf("priorityClass: unknown class %q; use one of %s or a number in priority", j.PriorityClass, strings.Join(names, ", "))
		}
		return c, nil
	}
	return DefaultPriority, nil
}

// Validate checks a job spec (priority classes from cfg) and returns an
// error naming the field and the fix.
func (j Job) Validate(cfg Config) error {
	_, err := j.Normalize(cfg)
	return err
}

// Shape is a validated job's priority and allowed sizes, defaults applied.
type Shape struct {
	Priority int
	Min, Max int
	Step     int
	Sizes    []int // nil unless discrete sizes
}

// Bounds returns the job's effective smallest and largest node counts, with
// the defaults applied (MinNodes 1 or the first of Sizes; MaxNodes MinNodes
// or the last of Sizes). It does not validate.
func (j Job) Bounds() (minNodes, maxNodes int) {
	minNodes, maxNodes = j.MinNodes, j.MaxNodes
	if len(j.Sizes) > 0 {
		if minNodes == 0 {
			minNodes = j.Sizes[0]
		}
		if maxNodes == 0 {
			maxNodes = j.Sizes[len(j.Sizes)-1]
		}
		return minNodes, maxNodes
	}
	if minNodes == 0 {
		minNodes = 1
	}
	if maxNodes == 0 {
		maxNodes = minNodes
	}
	return minNodes, maxNodes
}

// Normalize validates the job and returns its shape, defaults applied, or
// an error naming every bad field and its fix.
func (j Job) Normalize(cfg Config) (Shape, error) {
	var errs []error
	var s Shape
	if j.Name == "" {
		errs = append(errs, errors.New("name: must be set"))
	} else if err := ValidateName("name", j.Name); err != nil {
		errs = append(errs, err)
	}
	if j.Team == "" {
		errs = append(errs, errors.New("team: must be set"))
	} else if err := ValidateName("team", j.Team); err != nil {
		errs = append(errs, err)
	}
	p, err := j.ResolvePriority(cfg)
	if err != nil {
		errs = append(errs, err)
	}
	s.Priority = p
	if j.PerNode.Accelerators < 1 || j.PerNode.Accelerators > MaxNodeAccelerators {
		errs = append(errs, fmt.Errorf("perNode.accelerators: must be between 1 and %d (got %d)%s", MaxNodeAccelerators, j.PerNode.Accelerators, cpuHint(j.PerNode.Accelerators)))
	}
	if j.PerNode.VCPUs < 0 {
		errs = append(errs, fmt.Errorf("perNode.vcpus: must be >= 0 (got %d)", j.PerNode.VCPUs))
	}
	if j.PerNode.Memory < 0 {
		errs = append(errs, fmt.Errorf("perNode.memory: must be >= 0 (got %d)", j.PerNode.Memory))
	}
	s.Min, s.Max, s.Step = j.MinNodes, j.MaxNodes, j.Step
	if len(j.Sizes) > 0 {
		for i, z := range j.Sizes {
			if z < 1 || (i > 0 && z <= j.Sizes[i-1]) {
				errs = append(errs, fmt.Errorf("sizes: must be ascending node counts >= 1 without repeats (got %v)", j.Sizes))
				break
			}
		}
		if s.Min == 0 {
			s.Min = j.Sizes[0]
		}
		if s.Max == 0 {
			s.Max = j.Sizes[len(j.Sizes)-1]
		}
		for _, z := range j.Sizes {
			if z >= s.Min && z <= s.Max {
				s.Sizes = append(s.Sizes, z)
			}
		}
		if len(s.Sizes) == 0 || s.Sizes[0] != s.Min {
			errs = append(errs, fmt.Errorf("sizes: must include minNodes (%d); minNodes defaults to the first size", s.Min))
		}
		if j.Step != 0 {
			errs = append(errs, errors.New("step: set either step or sizes, not both"))
		}
		s.Step = 1
	} else {
		if s.Min == 0 {
			s.Min = 1
		}
		if s.Max == 0 {
			s.Max = s.Min
		}
		if s.Step == 0 {
			s.Step = 1
		}
		if s.Step < 0 {
			errs = append(errs, fmt.Errorf("step: must be >= 1 (got %d)", j.Step))
		}
	}
	if s.Min < 1 {
		errs = append(errs, fmt.Errorf("minNodes: must be >= 1 (got %d)", j.MinNodes))
	}
	if s.Max < s.Min {
		errs = append(errs, fmt.Errorf("maxNodes: must be >= minNodes (%d) (got %d)", s.Min, s.Max))
	}
	if s.Max > 1<<20 {
		errs = append(errs, fmt.Errorf("maxNodes: too large (%d)", s.Max))
	}
	if !j.Elastic && s.Max != s.Min {
		errs = append(errs, fmt.Errorf("maxNodes: a non-elastic job runs at exactly minNodes (%d); set maxNodes to it or set elastic: true", s.Min))
	}
	if err := wrap("job", j.Name, errs); err != nil {
		return Shape{}, err
	}
	return s, nil
}

func wrap(kind, name string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%s %q: %s", kind, name, strings.Join(msgs, "; "))
}

// cpuHint explains, for a job that asks for no accelerator, how CPU-only
// nodes are counted: each is one accelerator of flavor cpu, taken whole.
func cpuHint(accelerators int) string {
	if accelerators >= 1 {
		return ""
	}
	return "; a CPU-only node (flavor " + FlavorCPU + ") counts as one accelerator, taken whole: for a CPU job give perNode.accelerators: 1 (and flavor: " + FlavorCPU + " where the team has other flavors)"
}
