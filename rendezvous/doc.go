// Package rendezvous is hyperpodrun's elastic rendezvous on etcd v3: nodes
// of a job (torchrun's --rdzv-id) join rounds; a round closes with a fixed
// member list, group ranks, and rank 0's MASTER_ADDR and a fresh
// MASTER_PORT; any change (a member lost or failed, a node waiting while the
// round is below its size, a new target size) supersedes it promptly.
//
// # Use
//
//	cli, err := rendezvous.NewClient(endpoints, opts) // fails clearly if etcd does not answer
//	n, err := rendezvous.New(cli, rendezvous.Config{JobID: id, LocalWorldSize: 8, MinNodes: 2, MaxNodes: 4})
//	defer n.Close()
//	r, err := n.Join(ctx) // blocks until a closed round includes this node; spares keep waiting
//	// Start workers with r.Rank, r.Self.BaseRank, r.WorldSize, r.MasterAddr, r.MasterPort,
//	// then act on the first of:
//	//   n.Next(ctx, r) returns         the round was superseded: stop workers, Join again
//	//   workers failed                 n.ReportFailure(ctx, r, detail, summary), stop, Join again
//	//   workers succeeded              n.Finish(ctx, r)
//	//   the job's restarts are spent   n.FailJob(ctx, detail, summary), Leave: every node's Join
//	//                                  returns a *JobFailedError with the same summary
//	//   <-n.LeaseLost()                fencing: stop the workers at once
//
// # Key layout
//
// Under <prefix>/jobs/<job>/ (see keys.go): "target" and "restarts" are
// public decimal values; everything else lives under "rdzv/". Each node
// writes only keys that name itself, under its own lease: its member record
// rdzv/n/m/<node> (address, local world size), its election queue entry
// rdzv/q/<inverted revision>/<inverted time>/<node> (the revision and
// local time of its lease grant; written in the member record's
// transaction), and its acknowledgement rdzv/n/a/<node>. Failure and finish markers are per round
// (rdzv/n/f/<round>, rdzv/n/d/<round>, first writer wins; a failure report,
// with its time, stays until the third round after it opens: elasticctl shows the
// last one and the job Restarting while it is recent). One node, the
// closer, writes the round record: a small header rdzv/r/head and the member
// list in chunks rdzv/r/c/<round>/<nonce>/<i> of about 100 members, placed
// by a hash of the node id, so a member of a 10,000-node round reads one
// 5 KiB chunk instead of the whole list, and the record stays far below
// etcd's request limit. No key is raced by every node. The ready barrier
// of a round (fence.go): the first member to arrive claims
// rdzv/b/<round>/counter in its arrival's transaction, alone watches the
// arrivals, and writes rdzv/b/<round>/pass once every member arrived and no
// older round's running marker is left outside the round; the other
// members watch only the pass key.
//
// # Costs
//
// Joining costs a node two writes (the lease grant; one transaction of its
// member record and queue entry, with a read of the header and the first
// predecessor lookup), two watches (the header and its predecessor in the
// election), one read of its chunk per round, and one keepalive every TTL/3
// until its first round, every TTL/6 from then on (multiplexed per client;
// see lease.go for why so often). Passing the ready
// barrier costs two writes (the arrival, the running marker) and one watch
// of one key. Only the closer watches the members. From the first join to
// "workers may start", bench/rdzvscale counts about 4 etcd writes (raft
// proposals) per node in all, besides the closer's few per round.
//
// # Closer
//
// The oldest live node closes rounds; every other node watches only its
// predecessor in the election queue (see election.go), so losing the
// closer costs O(1) per node. The closer keeps the job's state in memory
// from one watch and writes the header with transactions guarded on the
// header's revision and on its own member record: a stale or fenced closer
// can never overwrite a newer decision. Its rules are one pure function,
// decide(view, now) in decide.go (propose, close, ack-timeout or wake-at),
// tested by tables without etcd; closer.go reads, watches and writes
// around it.
//
// A round closes at MaxNodes at once; at >= MinNodes after LastCallTimeout;
// at the target size (the desired record's size, clamped to [MIN, MAX]) at
// once. Nodes beyond the size wait as spares, preferred by join order; a
// waiting node while the round is below its size starts a new round (after
// the last call unless the size is reached). A lower target shrinks at
// once; a higher one grows at once when enough nodes wait, else after the
// last call from the first new node, so nodes started a moment apart join
// in one round rather than one round each. A draining member (Drain) is
// left out of the next round at once (NodeLeaving, a planned change every
// member sees). A lost
// member or a reported failure starts a new round at once with whoever is
// left (>= MinNodes; otherwise the round record says "open" and Next
// returns). Members keep their group rank where possible; freed ranks go
// to the remaining nodes in order.
//
// # Fast failure path
//
// A SIGKILLed agent's lease lives up to the TTL. Rounds formed after a
// failure or a loss therefore need every member to acknowledge the
// proposal (done by the node's own goroutine, not by the agent's code); a
// member that has not acknowledged AckTimeout (default 1s), plus 250 us per
// member of the round (every member reads the proposal first), after the
// last acknowledgement progress is left out and the round is proposed again
// without it. If it was alive after all, its late acknowledgement makes it a
// spare, and the next round takes it back. A dead closer would stall this
// path until its lease expired, so the node whose report opened a round's
// failure watches the closer too: if no next round appears within
// AckTimeout, it revokes the closer's lease and the next node in the closer
// queue takes over at once. The first round and growth
// rounds need only rank 0's acknowledgement, which carries the MASTER_PORT
// it picked. Losing a member is not a failure: only ReportFailure counts a
// restart, once per failed round, in <prefix>/jobs/<job>/restarts.
//
// # Fencing
//
// Each node renews its lease over a keepalive stream that remembers when
// each request was sent: a keepalive sent at s and answered with TTL t
// proves the lease alive until s+t. LeaseLost fires at s+t-FenceMargin for
// the latest confirmed s, strictly before the server can expire the lease
// and a new round can hand the node's rank to someone else. After
// LeaseLost (or Leave, Finish, Close) the node is done: its methods return
// errors wrapping ErrLeaseLost or ErrClosed; create a new Node to rejoin.
//
// Malformed values in etcd never panic: they yield errors (or, for the
// target and other nodes' records, error logs) naming the key.
package rendezvous
