package policy

// heap is a small binary heap.
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

// newHeap returns an empty heap ordered by less.
func newHeap[T any](less func(a, b T) bool) *heap[T] { return &heap[T]{less: less} }

// len is the number of items.
func (h *heap[T]) len() int { return len(h.items) }

// top is the least item.
func (h *heap[T]) top() T { return h.items[0] }

// push adds x.
func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	h.up(len(h.items) - 1)
}

// pop removes and returns the least item.
func (h *heap[T]) pop() T {
	x := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	return x
}

// fix restores the order after item i changed.
func (h *heap[T]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// up moves item i toward the root while it is less than its parent.
func (h *heap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			return
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

// down moves item i toward the leaves; it reports whether it moved.
func (h *heap[T]) down(i int) bool {
	start := i
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			c = r
		}
		if !h.less(h.items[c], h.items[i]) {
			break
		}
		h.items[i], h.items[c] = h.items[c], h.items[i]
		i = c
	}
	return i > start
}
