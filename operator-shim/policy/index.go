package policy

import "math/bits"

// The node index: per flavor, nodes are grouped into shapes (same healthy
// accelerator count), and within a shape every node that can take new work is
// in exactly one bucket, the one for its free accelerator count. Each bucket
// is a bitset over the shape's nodes (ordered by name), so picking the first
// fitting node is a word scan and every update is O(1): no O(jobs*nodes) scans.

type bitset struct {
	words []uint64
	count int
}

func (b *bitset) set(i, n int) {
	if b.words == nil {
		b.words = make([]uint64, (n+63)/64)
	}
	w, m := i/64, uint64(1)<<(uint(i)%64)
	if b.words[w]&m == 0 {
		b.words[w] |= m
		b.count++
	}
}

func (b *bitset) clear(i int) {
	if b.words == nil {
		return
	}
	w, m := i/64, uint64(1)<<(uint(i)%64)
	if b.words[w]&m != 0 {
		b.words[w] &^= m
		b.count--
	}
}

// next returns the first set index >= i, or -1.
func (b *bitset) next(i int) int {
	if b.count == 0 || i < 0 {
		return -1
	}
	w := i / 64
	if w >= len(b.words) {
		return -1
	}
	cur := b.words[w] >> (uint(i) % 64)
	if cur != 0 {
		return i + bits.TrailingZeros64(cur)
	}
	for w++; w < len(b.words); w++ {
		if b.words[w] != 0 {
			return w*64 + bits.TrailingZeros64(b.words[w])
		}
	}
	return -1
}

type shape struct {
	cap     int
	nodes   []*nodeRT
	buckets []bitset // index: free accelerators, 0..cap
}

type nodeRT struct {
	spec     *Node
	name     string
	fl       *flavorRT
	sh       *shape
	local    int
	cap      int
	used     int
	vcpuCap  int
	vcpuUsed int
	memCap   int64
	memUsed  int64
	// exclusive: held by a whole-node (multi-node) job.
	exclusive bool
	jobs      []*jobRT // tenants, in attach order
	// usable: takes new work (schedulable, not draining, healthy).
	usable bool
	bucket int
}

func (n *nodeRT) free() int { return n.cap - n.used }

// fitsExtra reports whether vCPU and memory requests fit (untracked = fits).
func (n *nodeRT) fitsExtra(vcpu int, mem int64) bool {
	if vcpu > 0 && n.vcpuCap > 0 && n.vcpuCap-n.vcpuUsed < vcpu {
		return false
	}
	if mem > 0 && n.memCap > 0 && n.memCap-n.memUsed < mem {
		return false
	}
	return true
}

// reindex moves n to the bucket matching its state.
func (n *nodeRT) reindex() {
	nb := -1
	if n.usable && !n.exclusive && n.used <= n.cap {
		nb = n.cap - n.used
	}
	if nb == n.bucket {
		return
	}
	if n.bucket >= 0 {
		n.sh.buckets[n.bucket].clear(n.local)
		n.fl.freeAccel -= n.bucket
		if n.bucket == n.cap && n.cap > 0 {
			n.fl.wholeFree--
		}
	}
	if nb >= 0 {
		n.sh.buckets[nb].set(n.local, len(n.sh.nodes))
		n.fl.freeAccel += nb
		if nb == n.cap && n.cap > 0 {
			n.fl.wholeFree++
		}
	}
	n.bucket = nb
}

// pickWhole appends to out up to count fully free nodes with at least per
// accelerators that fit vcpu/mem, smallest shape first, and returns out.
func (f *flavorRT) pickWhole(per, vcpu int, mem int64, count int, out []*nodeRT) []*nodeRT {
	for _, sh := range f.shapes {
		if sh.cap < per || sh.cap == 0 {
			continue
		}
		b := &sh.buckets[sh.cap]
		for i := b.next(0); i >= 0 && len(out) < count; i = b.next(i + 1) {
			if n := sh.nodes[i]; len(n.jobs) == 0 && n.fitsExtra(vcpu, mem) {
				out = append(out, n)
			}
		}
		if len(out) >= count {
			break
		}
	}
	return out
}

// pickFrac returns the best-fit node (fewest free accelerators that still
// fit) for a single-node job, or nil.
func (f *flavorRT) pickFrac(per, vcpu int, mem int64) *nodeRT {
	for k := per; k <= f.maxCap; k++ {
		for _, sh := range f.shapes {
			if sh.cap < k {
				continue
			}
			b := &sh.buckets[k]
			for i := b.next(0); i >= 0; i = b.next(i + 1) {
				if n := sh.nodes[i]; n.fitsExtra(vcpu, mem) {
					return n
				}
			}
		}
	}
	return nil
}
