package policy

import "sort"

// allowedMax is the largest allowed size.
func (j *jobRT) allowedMax() int {
	if j.sp.sizes != nil {
		return j.sp.sizes[len(j.sp.sizes)-1]
	}
	return j.sp.min + (j.sp.max-j.sp.min)/j.sp.step*j.sp.step
}

// floorSize is the largest allowed size <= n, or 0.
func (j *jobRT) floorSize(n int) int {
	if n < j.sp.min {
		return 0
	}
	if j.sp.sizes != nil {
		i := sort.SearchInts(j.sp.sizes, n+1)
		return j.sp.sizes[i-1]
	}
	return min(j.allowedMax(), j.sp.min+(n-j.sp.min)/j.sp.step*j.sp.step)
}

// nextSize is the smallest allowed size > n, or 0.
func (j *jobRT) nextSize(n int) int {
	if n < j.sp.min {
		return j.sp.min
	}
	if j.sp.sizes != nil {
		i := sort.SearchInts(j.sp.sizes, n+1)
		if i < len(j.sp.sizes) {
			return j.sp.sizes[i]
		}
		return 0
	}
	nx := j.floorSize(n) + j.sp.step
	if nx > j.allowedMax() {
		return 0
	}
	return nx
}

// smallerSize is the largest allowed size < n, or 0.
func (j *jobRT) smallerSize(n int) int { return j.floorSize(n - 1) }
