package query

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// listing10k is what 'elasticctl get jobs' reads at 10,000 jobs, as
// bench/ctl writes it: every job's spec and status, and a desired record
// for the half that runs.
type listing10k struct {
	k                        fleet.Keys
	specs, desired, statuses []*mvccpb.KeyValue
}

func newListing10k(tb testing.TB) *listing10k {
	tb.Helper()
	l := &listing10k{k: fleet.NewKeys("")}
	kv := func(key string, v any) *mvccpb.KeyValue {
		b, err := json.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		return &mvccpb.KeyValue{Key: []byte(key), Value: b, CreateRevision: int64(len(l.specs) + 1), ModRevision: 2, Version: 1}
	}
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10000 {
		name, team := fmt.Sprintf("job-%05d", i), fmt.Sprintf("team-%d", i%5)
		sub := base.Add(time.Duration(i) * time.Second)
		l.specs = append(l.specs, kv(l.k.Spec(team, name), fleet.JobSpec{Job: api.Job{Name: name, Team: team, Flavor: "nvidia-h100-80gb",
			PerNode: api.Resources{Accelerators: 8}, MinNodes: 1, MaxNodes: 4, Elastic: true, SubmitTime: sub}, Run: fleet.RunSpec{Script: "train.py"}}))
		r := api.Reason{Job: name, Team: team, Kind: api.KindPending, Code: api.CodeNoCapacity,
			Message: "quota allows it but no nodes are free: the team uses 800 of nominal 800 on nvidia-h100-80gb; the fleet has no free node with 8 accelerators"}
		if i%2 == 0 {
			r = api.Reason{Job: name, Team: team, Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "running within the team's nominal quota", FromSize: 1, ToSize: 1}
			l.desired = append(l.desired, kv(l.k.Desired(name), fleet.Desired{Allocation: api.Allocation{Job: name, Team: team, Flavor: "nvidia-h100-80gb",
				Size: 1, Nodes: []string{fmt.Sprintf("node-%d", i)}, AcceleratorsPerNode: 8, Since: sub.Add(time.Minute), LastResize: sub.Add(time.Minute)}, Generation: 1}))
		}
		l.statuses = append(l.statuses, kv(l.k.Status(name), fleet.Status{Reason: r, Time: sub, Since: sub}))
	}
	return l
}

// decode decodes the three lists as jobsSnapshot does, with the lean
// readers (JobsListing) or with encoding/json (JobsSnapshot).
func (l *listing10k) decode(tb testing.TB, lean bool) {
	specDec := specDecoder(l.k)
	desDec := decoder[fleet.Desired](fleet.DecodeDesired)
	statDec := decoder[fleet.Status](fleet.DecodeStatus)
	if lean {
		specDec, desDec, statDec = leanSpecDecoder(l.k), leanDesiredDecoder(), leanStatusDecoder()
	}
	owned, _ := l.k.OwnedSpecs(l.specs)
	specs, bad1 := decodeParallel(owned, specDec)
	des, bad2 := decodeParallel(l.desired, desDec)
	stats, bad3 := decodeParallel(l.statuses, statDec)
	if len(bad1)+len(bad2)+len(bad3) > 0 || len(specs) != 10000 || len(des) != 5000 || len(stats) != 10000 {
		tb.Fatalf("decoded %d specs, %d desired, %d statuses; problems %v %v %v", len(specs), len(des), len(stats), bad1, bad2, bad3)
	}
}

// BenchmarkListingDecode10k: the JSON decoding of 'get jobs' at 10,000
// jobs, package jsonscan's lean readers against encoding/json.
func BenchmarkListingDecode10k(b *testing.B) {
	l := newListing10k(b)
	for _, c := range []struct {
		name string
		lean bool
	}{{"jsonscan", true}, {"encoding-json", false}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				l.decode(b, c.lean)
			}
		})
	}
}

// BenchmarkListingDecoders prints the figures of BenchmarkListingDecode10k
// as BENCH lines (make bench): the median of 9 decodings each way, taken
// in turn so that both see the same load.
func BenchmarkListingDecoders(b *testing.B) {
	l := newListing10k(b)
	var lean, std []time.Duration
	for range 9 {
		for _, c := range []struct {
			lean bool
			to   *[]time.Duration
		}{{true, &lean}, {false, &std}} {
			start := time.Now()
			l.decode(b, c.lean)
			*c.to = append(*c.to, time.Since(start))
		}
	}
	slices.Sort(lean)
	slices.Sort(std)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("BENCH elasticctl_listing_decode_10k %.1f ms anchor=%.1f\n", ms(lean[4]), ms(std[4]))
	fmt.Printf("BENCH elasticctl_listing_decode_10k_speedup %.1f x anchor=1 target=2\n", float64(std[4])/float64(lean[4]))
}
