package query

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The lean readers take the records the coordinator and elasticctl write
// (they fall back to encoding/json only for odd ones).
func TestLeanReadersTakeWrittenRecords(t *testing.T) {
	p := 70
	spec, _ := json.Marshal(fleet.JobSpec{Job: api.Job{Name: "a", Team: "t", Priority: &p, Sizes: []int{1, 2}, Elastic: true}, Run: fleet.RunSpec{Script: "x.py", Env: map[string]string{"A": "b"}}})
	des, _ := json.Marshal(fleet.Desired{Allocation: api.Allocation{Job: "a", Size: 2, Nodes: []string{"n1", "n2"}}, Generation: 2})
	stat, _ := json.Marshal(fleet.Status{Reason: api.Reason{Job: "a", Kind: "Running", Code: "WithinQuota", Message: "ok", Holders: []api.Holder{{Job: "b"}}}})
	fin, _ := json.Marshal(fleet.Finish{Outcome: fleet.Failed, Node: "n1", Message: "exit 1"})
	if j, err := leanSpec(spec); err != nil || j.Name != "a" || *j.Priority != 70 || len(j.Sizes) != 2 || !j.Elastic || j.Run.Script != "" {
		t.Errorf("leanSpec: %+v %v", j, err)
	}
	if d, err := leanDesired(des); err != nil || !desiredOK("/x/desired/a", d) || d.Nodes[1] != "n2" || d.Generation != 2 {
		t.Errorf("leanDesired: %+v %v", d, err)
	}
	if s, err := leanStatus(stat); err != nil || s.Code != "WithinQuota" || s.Holders != nil {
		t.Errorf("leanStatus: %+v %v", s, err)
	}
	if f, err := leanFinish(fin); err != nil || f.Message != "exit 1" {
		t.Errorf("leanFinish: %+v %v", f, err)
	}
}

// Where the lean spec reader takes a value encoding/json takes too, both
// read the same listed fields; where encoding/json refuses one the lean
// reader takes, the reason is a field the listing does not read having
// the wrong type (never the syntax).
func FuzzLeanSpec(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","team":"t","priority":5,"sizes":[1,2],"submitTime":"2026-01-02T03:04:05Z","run":{"script":"x"}}`,
		`{"NAME":"a","x":[1,{"y":null}],"elastic":true}`,
		`{"name":"\u0061","flavor":"\"","maxNodes":-0,"run":{"args":["a"]}}`,
		` { "name" : "a" , "minNodes" : 1e2 } `,
		`{"name":"a","run":5}`,
		`{"name":"abcdefghij\"klmnopq\\rstuvwxyz","flavor":"0123456789abcdef\u00e9xyz","run":{"script":"long plain text over eight bytes"}}`,
		"{\"name\":\"abcdefghijklmnop\tq\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		lean, lerr := leanSpec(v)
		var full fleet.JobSpec
		ferr := json.Unmarshal(v, &full)
		switch {
		case lerr != nil:
			return // the full decoder decides
		case ferr != nil:
			var te *json.UnmarshalTypeError
			if !errors.As(ferr, &te) && json.Valid(v) {
				t.Errorf("lean took %q, which encoding/json refuses: %v", v, ferr)
			}
			if !json.Valid(v) {
				t.Errorf("lean took invalid JSON %q", v)
			}
			return
		}
		show := func(j *fleet.JobSpec) string {
			p := "nil"
			if j.Priority != nil {
				p = fmt.Sprint(*j.Priority)
			}
			return fmt.Sprintf("%q %q %s %q %q %d %d %v %v %v %s", j.Name, j.Team, p, j.PriorityClass, j.Flavor, j.MinNodes, j.MaxNodes, j.Sizes, j.Elastic, j.Suspended, j.SubmitTime)
		}
		if a, b := show(lean), show(&full); a != b {
			t.Errorf("%q: lean read %s, encoding/json %s", v, a, b)
		}
	})
}
