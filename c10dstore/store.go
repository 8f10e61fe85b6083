package c10dstore

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
)

// ErrStoreFull is returned when a write would take the store over
// Options.MaxStoreBytes.
var ErrStoreFull = errors.New("c10d store: store size limit reached")

// waiter is one pending WAIT (of a connection or of an in-process caller).
// All fields are guarded by store.mu.
type waiter struct {
	missing map[string]struct{}
	fire    func() // called under store.mu once every key exists; must not block
	done    bool
}

// watchSink receives legacy WATCH_KEY notifications; called under store.mu,
// must not block.
type watchSink interface {
	notify(msg []byte)
}

// store is the key/value state shared by every connection.
type store struct {
	mu       sync.Mutex
	data     map[string][]byte
	queues   map[string][][]byte
	waiters  map[string][]*waiter
	watchers map[string][]watchSink
	bytes    int64 // keys + values + queued values
	maxBytes int64
}

func newStore(maxBytes int64) *store {
	return &store{
		data:     make(map[string][]byte),
		queues:   make(map[string][][]byte),
		waiters:  make(map[string][]*waiter),
		watchers: make(map[string][]watchSink),
		maxBytes: maxBytes,
	}
}

func (s *store) ready(key string) bool {
	if _, ok := s.data[key]; ok {
		return true
	}
	return len(s.queues[key]) > 0
}

// put stores value under key, accounting for its size. Callers hold mu.
func (s *store) put(key string, value []byte) error {
	old, existed := s.data[key]
	delta := int64(len(value)) - int64(len(old))
	if !existed {
		delta += int64(len(key))
	}
	if delta > 0 && s.maxBytes > 0 && s.bytes+delta > s.maxBytes {
		return ErrStoreFull
	}
	s.bytes += delta
	s.data[key] = value
	return nil
}

// set is SET: store, notify watchers, wake waiters.
func (s *store) set(key string, value []byte) error {
	old, existed := s.data[key]
	if err := s.put(key, value); err != nil {
		return err
	}
	s.notifyChange(key, existed, old, value)
	s.wakeAll(key)
	return nil
}

func (s *store) notifyChange(key string, existed bool, old, value []byte) {
	if existed {
		s.notify(key, watchKeyUpdated, old, value)
	} else {
		s.notify(key, watchKeyCreated, nil, value)
	}
}

// compareSet is COMPARE_SET with torch's semantics: a missing key is created
// only when expected is empty; the reply is the value now stored, or (for a
// missing key and a non-empty expected) expected itself.
func (s *store) compareSet(key string, expected, desired []byte) ([]byte, error) {
	cur, ok := s.data[key]
	if !ok {
		if len(expected) != 0 {
			return expected, nil
		}
		if err := s.put(key, desired); err != nil {
			return nil, err
		}
		s.notify(key, watchKeyCreated, nil, desired)
		s.wakeAll(key)
		return desired, nil
	}
	if string(cur) == string(expected) {
		if err := s.put(key, desired); err != nil {
			return nil, err
		}
		s.notify(key, watchKeyUpdated, cur, desired)
		s.wakeAll(key)
		return desired, nil
	}
	return cur, nil
}

// add is ADD: the stored value is a decimal integer (std::stoll's leniency:
// leading spaces, a sign, digits, anything after them ignored).
func (s *store) add(key string, delta int64) (int64, error) {
	old, existed := s.data[key]
	v := delta
	if existed {
		n, err := stoll(old)
		if err != nil {
			return 0, fmt.Errorf("ADD to key %q: %w", key, err)
		}
		v += n
	}
	nv := []byte(strconv.FormatInt(v, 10))
	if err := s.put(key, nv); err != nil {
		return 0, err
	}
	s.notifyChange(key, existed, old, nv)
	s.wakeAll(key)
	return v, nil
}

// stoll parses like C++ std::stoll(str, nullptr, 10).
func stoll(b []byte) (int64, error) {
	i := 0
	for i < len(b) && (b[i] == ' ' || (b[i] >= '\t' && b[i] <= '\r')) {
		i++
	}
	j := i
	if j < len(b) && (b[j] == '+' || b[j] == '-') {
		j++
	}
	k := j
	for k < len(b) && b[k] >= '0' && b[k] <= '9' {
		k++
	}
	if k == j {
		return 0, fmt.Errorf("stored value %q is not an integer", truncate(b))
	}
	n, err := strconv.ParseInt(string(b[i:k]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stored value %q is out of range", truncate(b))
	}
	return n, nil
}

func truncate(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

func (s *store) appendTo(key string, value []byte) error {
	old, existed := s.data[key]
	nv := value
	if existed {
		nv = make([]byte, 0, len(old)+len(value))
		nv = append(append(nv, old...), value...)
	}
	if err := s.put(key, nv); err != nil {
		return err
	}
	if existed {
		s.notify(key, watchKeyAppended, nil, value)
	} else {
		s.notify(key, watchKeyCreated, nil, value)
	}
	s.wakeAll(key)
	return nil
}

func (s *store) deleteKey(key string) int64 {
	old, ok := s.data[key]
	if !ok {
		return 0
	}
	s.bytes -= int64(len(key) + len(old))
	delete(s.data, key)
	s.notify(key, watchKeyDeleted, old, nil)
	return 1
}

func (s *store) queuePush(key string, value []byte) error {
	q, existed := s.queues[key]
	delta := int64(len(value))
	if !existed {
		delta += int64(len(key))
	}
	if s.maxBytes > 0 && s.bytes+delta > s.maxBytes {
		return ErrStoreFull
	}
	s.bytes += delta
	s.queues[key] = append(q, value)
	s.wakeOne(key)
	return nil
}

// queuePop returns the queue's length before the pop and the popped value.
func (s *store) queuePop(key string) (int64, []byte) {
	q := s.queues[key]
	if len(q) == 0 {
		return 0, nil
	}
	v := q[0]
	q[0] = nil
	s.bytes -= int64(len(v))
	if len(q) == 1 {
		delete(s.queues, key)
		s.bytes -= int64(len(key))
	} else {
		s.queues[key] = q[1:]
	}
	return int64(len(q)), v
}

// wait registers w for keys; it returns false when every key is ready
// already (w is then not registered and fire is not called).
func (s *store) wait(keys []string, w *waiter) bool {
	for _, k := range keys {
		if !s.ready(k) {
			if w.missing == nil {
				w.missing = make(map[string]struct{}, len(keys))
			}
			w.missing[k] = struct{}{}
		}
	}
	if len(w.missing) == 0 {
		return false
	}
	for k := range w.missing {
		s.waiters[k] = append(s.waiters[k], w)
	}
	return true
}

// cancel unregisters w; it reports whether w was still pending.
func (s *store) cancel(w *waiter) bool {
	if w == nil || w.done {
		return false
	}
	w.done = true
	for k := range w.missing {
		list := s.waiters[k]
		for i, x := range list {
			if x == w {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(s.waiters, k)
		} else {
			s.waiters[k] = list
		}
	}
	return true
}

// wakeAll: key now exists; fire every waiter that has nothing else to wait for.
func (s *store) wakeAll(key string) {
	list, ok := s.waiters[key]
	if !ok {
		return
	}
	delete(s.waiters, key)
	for _, w := range list {
		if w.done {
			continue
		}
		delete(w.missing, key)
		if len(w.missing) == 0 {
			w.done = true
			w.fire()
		}
	}
}

// wakeOne: one value was queued under key; fire the oldest waiter that waits
// for nothing else (torch wakes one waiter per push).
func (s *store) wakeOne(key string) {
	list := s.waiters[key]
	for i, w := range list {
		if w.done || len(w.missing) != 1 {
			continue
		}
		w.done = true
		delete(w.missing, key)
		list = append(list[:i], list[i+1:]...)
		if len(list) == 0 {
			delete(s.waiters, key)
		} else {
			s.waiters[key] = list
		}
		w.fire()
		return
	}
}

func (s *store) watch(key string, sink watchSink) {
	s.watchers[key] = append(s.watchers[key], sink)
}

func (s *store) unwatch(key string, sink watchSink) {
	list := s.watchers[key]
	for i, x := range list {
		if x == sink {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.watchers, key)
	} else {
		s.watchers[key] = list
	}
}

// notify sends a legacy watch notification: type, key, old value, new value.
func (s *store) notify(key string, kind byte, old, value []byte) {
	list := s.watchers[key]
	if len(list) == 0 {
		return
	}
	msg := make([]byte, 0, 1+8*3+len(key)+len(old)+len(value))
	msg = append(msg, kind)
	msg = appendString(msg, key)
	msg = appendBytes(msg, old)
	msg = appendBytes(msg, value)
	for _, w := range list {
		w.notify(msg)
	}
}
