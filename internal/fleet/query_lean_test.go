package fleet

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// The lean readers take the records the coordinator and elasticctl write
// (they fall back to encoding/json only for odd ones).
func TestLeanReadersTakeWrittenRecords(t *testing.T) {
	p := 70
	spec, _ := json.Marshal(JobSpec{Job: api.Job{Name: "a", Team: "t", Priority: &p, Sizes: []int{1, 2}, Elastic: true}, Run: RunSpec{Script: "x.py", Env: map[string]string{"A": "b"}}})
	des, _ := json.Marshal(Desired{Allocation: api.Allocation{Job: "a", Size: 2, Nodes: []string{"n1", "n2"}}, Generation: 2})
	stat, _ := json.Marshal(Status{Reason: api.Reason{Job: "a", Kind: "Running", Code: "WithinQuota", Message: "ok", Holders: []api.Holder{{Job: "b"}}}})
	fin, _ := json.Marshal(Finish{Outcome: Failed, Node: "n1", Message: "exit 1"})
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
		var full JobSpec
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
		show := func(j *JobSpec) string {
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

// rawRange decodes a RangeResponse as the protobuf decoder does.
func FuzzRawRangeDecode(f *testing.F) {
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{ClusterId: 9, Revision: 1234, RaftTerm: 3}, More: true, Count: 3,
		Kvs: []*mvccpb.KeyValue{
			{Key: []byte("/a/specs/t/x"), Value: []byte(`{"name":"x"}`), CreateRevision: 5, ModRevision: 7, Version: 2, Lease: 99},
			{Key: []byte("/a/events/1-x"), CreateRevision: 1 << 40, ModRevision: 1 << 41, Version: 1},
			{Key: []byte{0xff, 0}, Value: []byte{}},
		}}
	b, err := proto.Marshal(resp)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x12, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.RangeResponse
		werr := proto.Unmarshal(b, &want)
		var got rawRange
		gerr := got.decode(b)
		if werr != nil {
			return // the raw decoder may or may not notice; it must not panic
		}
		if gerr != nil {
			t.Fatalf("%x: protobuf decodes it, the raw decoder: %v", b, gerr)
		}
		if got.rev != want.GetHeader().GetRevision() || len(got.kvs) != len(want.Kvs) {
			t.Fatalf("revision %d, %d kvs; want %d, %d", got.rev, len(got.kvs), want.GetHeader().GetRevision(), len(want.Kvs))
		}
		for i, kv := range want.Kvs {
			g := got.kvs[i]
			if string(g.Key) != string(kv.Key) || string(g.Value) != string(kv.Value) || g.CreateRevision != kv.CreateRevision ||
				g.ModRevision != kv.ModRevision || g.Version != kv.Version || g.Lease != kv.Lease {
				t.Fatalf("kv %d: %v, want %v", i, g, kv)
			}
		}
	})
}

// special8 finds a quote, a backslash or a control character at any of
// the eight places, and nothing else (other bytes around it included).
func TestSpecial8(t *testing.T) {
	for _, fill := range []byte{'a', 0x7f, 0xff, 0x20, 0x21} {
		for b := range 256 {
			for p := range 8 {
				var buf [8]byte
				for i := range buf {
					buf[i] = fill
				}
				buf[p] = byte(b)
				want := b == '"' || b == '\\' || b < 0x20
				if got := special8(binary.LittleEndian.Uint64(buf[:])); got != want {
					t.Fatalf("byte %#x at %d among %#x: %v, want %v", b, p, fill, got, want)
				}
			}
		}
	}
}
