package launcher

// BudgetSpent reports whether a job that has seen failures failures may
// not restart again under a budget of limit restarts: failures counts
// every failure so far, including the one just seen, so a budget of limit
// allows limit restarts and the failure after the last of them ends the
// job (torchrun's --max-restarts). A negative limit allows none.
//
// Every place that decides "restart budget spent" asks it: hyperpodrun's
// static agent (local worker failures), its elastic agent (the job's
// failures, counted in etcd for all its nodes) and the node agent's job
// runner (consecutive failures of hyperpodrun on its node).
func BudgetSpent(failures, limit int) bool {
	return failures > max(limit, 0)
}
