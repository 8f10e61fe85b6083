package launcher

import (
	"fmt"
	"strconv"
	"strings"
)

// Std says which of a worker's streams go to a log file: torchrun's
// NONE (0), OUT (1), ERR (2) and ALL (3).
type Std int

// The stream selections torchrun accepts for --redirects and --tee.
const (
	StdNone Std = 0
	StdOut  Std = 1
	StdErr  Std = 2
	StdAll  Std = 3
)

// Has reports whether s selects the given stream (StdOut or StdErr).
func (s Std) Has(stream Std) bool { return s&stream != 0 }

// StdSpec is a parsed --redirects/--tee value: one Std for all local ranks,
// or a per-rank mapping ("0:1,1:3"); ranks not in the map get StdNone.
type StdSpec struct {
	all    Std
	perRnk map[int]Std
}

// For returns the selection for one local rank.
func (s StdSpec) For(localRank int) Std {
	if s.perRnk != nil {
		return s.perRnk[localRank]
	}
	return s.all
}

// String renders the spec the way it is written on the command line.
func (s StdSpec) String() string {
	if s.perRnk == nil {
		return strconv.Itoa(int(s.all))
	}
	parts := make([]string, 0, len(s.perRnk))
	for r, v := range s.perRnk {
		parts = append(parts, fmt.Sprintf("%d:%d", r, v))
	}
	return strings.Join(parts, ",")
}

// ParseStd parses torchrun's --redirects/--tee syntax: "3" or "0:1,1:2".
// flag names the option in error messages.
func ParseStd(flag, v string) (StdSpec, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return StdSpec{}, nil
	}
	one := func(s string) (Std, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > 3 {
			return 0, fmt.Errorf("--%s: %q is not a stream selection: use 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or a per-rank map like 0:1,1:3", flag, s)
		}
		return Std(n), nil
	}
	if !strings.Contains(v, ":") {
		s, err := one(v)
		return StdSpec{all: s}, err
	}
	spec := StdSpec{perRnk: map[int]Std{}}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, ":")
		if !ok {
			return StdSpec{}, fmt.Errorf("--%s: %q: every entry of a per-rank map needs the form local_rank:selection, e.g. 0:1,1:3", flag, kv)
		}
		r, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || r < 0 {
			return StdSpec{}, fmt.Errorf("--%s: %q is not a local rank (want a number >= 0)", flag, k)
		}
		s, err := one(val)
		if err != nil {
			return StdSpec{}, err
		}
		spec.perRnk[r] = s
	}
	return spec, nil
}

// ParseRankFilter parses --local-ranks-filter ("0,2"): the local ranks whose
// console output is shown. Empty means all ranks; the result is nil then.
func ParseRankFilter(v string) (map[int]bool, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	set := map[int]bool{}
	for _, s := range strings.Split(v, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || r < 0 {
			return nil, fmt.Errorf("--local-ranks-filter: %q is not a local rank: give a comma-separated list like 0,2", s)
		}
		set[r] = true
	}
	return set, nil
}
