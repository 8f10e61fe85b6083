package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// describeCheckpointFailure prints the last planned change whose
// checkpoint could not be saved (issue 24: a planned change never loses
// steps without saying so in the job's status): when, where, and the
// agent's words (the failed save, the tries, the steps lost or kept).
func describeCheckpointFailure(w io.Writer, f *fleet.CheckpointFailure) {
	if f == nil {
		return
	}
	where := ""
	if f.Node != "" {
		where = " on " + f.Node
	}
	when := ""
	if !f.Time.IsZero() {
		when = " at " + f.Time.Format(time.RFC3339)
	}
	lost := "no step lost"
	if f.LostSteps > 0 {
		lost = fmt.Sprintf("%d steps lost", f.LostSteps)
	}
	fmt.Fprintf(w, "Failed checkpoint: the planned change of round %d%s%s (%s):\n", f.Round, where, when, lost)
	fmt.Fprintf(w, "            %s\n", f.Detail)
}
