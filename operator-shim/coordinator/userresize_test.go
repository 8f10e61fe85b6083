package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The decision span of a user's resize says who asked for it
// (requested_by) beside its reason code; a decision nobody asked for names
// no one.
func TestUserResizeDecisionSpanNamesWhoAsked(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	runCoordinator(t, ctx, New(cli, Config{Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}, Tracer: tp}))
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "tj", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 2, Elastic: true,
		RequestedBy: "etcd user submitter"}}); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "tj", "2")
	if _, err := st.UpdateJob(ctx, "tj", func(j *fleet.JobSpec) error {
		j.MaxNodes, j.RequestedBy = 1, "etcd user research"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "tj", "1")
	spans := map[string]map[string]string{} // by to_size
	testutil.Eventually(t, 10*time.Second, "the two decision spans", func() (bool, string) {
		for _, s := range rec.Ended() {
			attrs := map[string]string{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			if s.Name() == "coordinator.decision" && attrs["job"] == "tj" {
				spans[attrs["to_size"]] = attrs
			}
		}
		return spans["2"] != nil && spans["1"] != nil, fmt.Sprint(spans)
	})
	shrink := spans["1"]
	if shrink["code"] != string(policy.CodeSpecChanged) || shrink["requested_by"] != "etcd user research" ||
		!strings.Contains(shrink["reason"], "at the user's request") || shrink["from_size"] != "2" {
		t.Errorf("the resize's decision span: %v; want code SpecChanged, requested_by etcd user research", shrink)
	}
	if by, ok := spans["2"]["requested_by"]; ok {
		t.Errorf("the admission's decision span names %q as asking for it", by)
	}
}
