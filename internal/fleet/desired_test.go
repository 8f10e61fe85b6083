package fleet

import (
	"strings"
	"testing"
)

// A desired record is read by every node of the fleet: one that does not
// hold together is refused with its key named, never half-applied.
func TestDecodeDesired(t *testing.T) {
	const key = "/hyperpodrun/desired/j"
	for _, tc := range []struct {
		value  string
		target int // -1: refused
	}{
		{`{"job":"j","size":2,"nodes":["a","b"],"generation":3}`, 2},
		{`{"job":"j","size":3,"generation":1}`, 3}, // a target without placement
		{`{"job":"j","size":0,"generation":4,"stop":{"kind":"preemption","reason":"for prod"}}`, 0},
		{`{"job":"j","size":0,"generation":4,"stop":{"kind":"shutdown"}}`, 0},
		{`{"job":"other","size":1,"generation":1}`, -1},                       // names another job
		{`{"size":1,"generation":1}`, -1},                                     // no job
		{`{"job":"j","size":0,"generation":1}`, -1},                           // no size, no stop
		{`{"job":"j","size":2,"nodes":["a"],"generation":1}`, -1},             // nodes disagree with size
		{`{"job":"j","size":1,"nodes":["a"],"stop":{"kind":"shutdown"}}`, -1}, // stopped but placed
		{`{"job":"j","size":0,"stop":{"kind":"drain"}}`, -1},                  // unknown stop kind
		{`{"job":"j","size":1,"generation":-1}`, -1},                          // negative generation
		{`3`, -1}, // the old target record
		{`{not json`, -1},
	} {
		d, err := DecodeDesired(key, []byte(tc.value))
		switch {
		case tc.target < 0 && (err == nil || !strings.Contains(err.Error(), key)):
			t.Errorf("%s: got %+v, %v; want an error naming %s", tc.value, d, err, key)
		case tc.target >= 0 && err != nil:
			t.Errorf("%s: %v", tc.value, err)
		case tc.target >= 0 && d.Target() != tc.target:
			t.Errorf("%s: target %d, want %d", tc.value, d.Target(), tc.target)
		}
	}
	var none *Desired
	if none.Target() != 0 || none.Running() {
		t.Error("no record must mean no target and nothing running")
	}
}
