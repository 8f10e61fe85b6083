package etcdraw

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

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
