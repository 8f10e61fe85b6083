package elastic

import (
	"context"
	"fmt"

	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// A job that fails fails on every node, promptly, with one summary: the
// node that finds the job's restarts spent fails the job in the
// rendezvous (rendezvous.Node.FailJob) with the failure summary of the
// round that failed, root cause first; every other node, waiting for a
// round or running one, then ends with that summary too, as torchrun's
// agents all fail once one closes the rendezvous after its last restart.

// printSummary writes a failure summary to stderr once: a node prints the
// job's summary at its end unless it printed the same text already.
func (e *elastic) printSummary(summary string) {
	if summary == "" || summary == e.summary {
		return
	}
	fmt.Fprint(e.o.stderrW(), summary)
	e.summary = summary
}

// failJob fails the job for every node: the restarts are spent (err says
// so). The summary is the one the failed round's report carried, else this
// node's own.
func (e *elastic) failJob(ctx context.Context, err error) {
	summary := e.summary
	if e.round != nil && e.round.FailureSummary != "" {
		summary = e.round.FailureSummary
	}
	e.printSummary(summary)
	fctx, cancel := context.WithTimeout(detached(ctx), e.opTimeout())
	defer cancel()
	if ferr := e.node.FailJob(fctx, fmt.Sprintf("%v (node %s)", err, e.node.ID()), summary); ferr != nil {
		e.log.Warn("could not tell the other nodes that the job failed; they fail at their join timeout", "err", ferr)
	}
}

// jobFailedElsewhere is this node's error once another node failed the job
// for good: its summary is printed here too.
func (e *elastic) jobFailedElsewhere(jf *rendezvous.JobFailedError) error {
	e.printSummary(jf.Summary)
	return &ExitError{1, fmt.Errorf("%s; this node stops too", jf.Detail)}
}
