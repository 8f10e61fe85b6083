package policy

import "github.com/hyperpodrun/hyperpodrun/api"

// Constants and helpers of package api, under the engine's names.
const (
	PreemptNever           = api.PreemptNever
	PreemptLowerPriority   = api.PreemptLowerPriority
	BestEffortFIFO         = api.BestEffortFIFO
	StrictFIFO             = api.StrictFIFO
	KindAdmitted           = api.KindAdmitted
	KindRunning            = api.KindRunning
	KindGrown              = api.KindGrown
	KindShrunk             = api.KindShrunk
	KindRepaired           = api.KindRepaired
	KindMoved              = api.KindMoved
	KindPreempted          = api.KindPreempted
	KindPending            = api.KindPending
	KindSuspended          = api.KindSuspended
	KindInvalid            = api.KindInvalid
	CodeWithinQuota        = api.CodeWithinQuota
	CodeBorrowing          = api.CodeBorrowing
	CodeReclaim            = api.CodeReclaim
	CodePriorityPreemption = api.CodePriorityPreemption
	CodeFairShare          = api.CodeFairShare
	CodeStablePeriod       = api.CodeStablePeriod
	CodeAtMax              = api.CodeAtMax
	CodeNoFlavor           = api.CodeNoFlavor
	CodeQuotaExceeded      = api.CodeQuotaExceeded
	CodeBorrowingLimit     = api.CodeBorrowingLimit
	CodeCohortExhausted    = api.CodeCohortExhausted
	CodeNoCapacity         = api.CodeNoCapacity
	CodeReserved           = api.CodeReserved
	CodeStrictFIFO         = api.CodeStrictFIFO
	CodeNodeLost           = api.CodeNodeLost
	CodeDefragment         = api.CodeDefragment
	CodeSpecChanged        = api.CodeSpecChanged
	CodeTeamNotFound       = api.CodeTeamNotFound
	CodeInvalidSpec        = api.CodeInvalidSpec
	CodeSuspended          = api.CodeSuspended
	DefaultMinStablePeriod = api.DefaultMinStablePeriod
	DefaultPriority        = api.DefaultPriority
	MaxNodeAccelerators    = api.MaxNodeAccelerators
)

// DefaultPriorityClasses is api.DefaultPriorityClasses.
var DefaultPriorityClasses = api.DefaultPriorityClasses

// ParseByteSize is api.ParseByteSize.
func ParseByteSize(s string) (ByteSize, error) { return api.ParseByteSize(s) }

// spec is a validated job with defaults applied, as the engine uses it.
type spec struct {
	prio     int
	min, max int
	step     int
	sizes    []int // nil unless discrete sizes
}

func normalize(j Job, cfg Config) (spec, error) {
	s, err := j.Normalize(cfg)
	return spec{prio: s.Priority, min: s.Min, max: s.Max, step: s.Step, sizes: s.Sizes}, err
}
