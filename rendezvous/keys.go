package rendezvous

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// keys is the etcd layout of one job as the rendezvous uses it: its own
// private records (fleet.RdzvKeys) and the job's desired record and restart
// counters, all named by package fleet.
type keys struct {
	fleet.RdzvKeys
	desired, restarts, restartsCounted string
}

func newKeys(prefix, job string) keys {
	l := fleet.NewKeys(prefix)
	return keys{RdzvKeys: l.Rdzv(job), desired: l.Desired(job), restarts: l.Restarts(job), restartsCounted: l.RestartsCounted(job)}
}

// Header states.
const (
	stateOpen     = "open"     // a round is gathering; no member list yet
	stateProposed = "proposed" // member list fixed, waiting for acknowledgements
	stateClosed   = "closed"   // final
	// stateFinished: every member of the closed round finished (its
	// workers succeeded): the job is done and its rendezvous closed for
	// good, as torch's is. A node joining later is refused.
	stateFinished = "finished"
	// stateFailed: the job failed for good (its restarts are spent, see
	// Node.FailJob): every node waiting for or running a round ends with
	// the failure summary the header carries, as torch's agents leave a
	// rendezvous that was closed after a failure.
	stateFailed = "failed"
)

const formatVersion = 1

// header is the round record at <base>/rdzv/r/head.
type header struct {
	V          int    `json:"v"`
	Round      int64  `json:"round"`
	State      string `json:"state"`
	Nonce      string `json:"nonce,omitempty"`
	Nodes      int    `json:"nodes,omitempty"`
	World      int    `json:"world,omitempty"`
	Chunks     int    `json:"chunks,omitempty"`
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port,omitempty"`
	Target     int    `json:"target,omitempty"`
	// AckAll: every member must acknowledge the proposal (rounds formed
	// after a failure or loss); otherwise only rank 0 does (MASTER_PORT).
	AckAll bool   `json:"ack_all,omitempty"`
	Reason Reason `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
	Closer string `json:"closer,omitempty"`
	// Summary is the failure summary of the failed round a MemberFailed
	// round follows, and of the job in a failed header.
	Summary string `json:"summary,omitempty"`
}

func decodeHeader(key string, v []byte) (*header, error) {
	var h header
	if err := json.Unmarshal(v, &h); err != nil {
		return nil, fmt.Errorf("rendezvous: malformed round record at %s: %w (value %q)", key, err, clip(v))
	}
	bad := func(why string) error {
		return fmt.Errorf("rendezvous: malformed round record at %s: %s (value %q)", key, why, clip(v))
	}
	if h.V != formatVersion {
		return nil, bad(fmt.Sprintf("format version %d, this hyperpodrun understands %d", h.V, formatVersion))
	}
	if h.Round <= 0 {
		return nil, bad("round number must be positive")
	}
	switch h.State {
	case stateOpen, stateFinished, stateFailed:
	case stateProposed, stateClosed:
		if h.Nodes <= 0 || h.World < h.Nodes || h.Chunks <= 0 || h.Chunks > h.Nodes || h.Nonce == "" || strings.ContainsAny(h.Nonce, "/ ") {
			return nil, bad("inconsistent nodes/world/chunks/nonce")
		}
		if h.State == stateClosed && (h.MasterAddr == "" || h.MasterPort <= 0 || h.MasterPort > 65535) {
			return nil, bad("closed round without a valid master address and port")
		}
	default:
		return nil, bad(fmt.Sprintf("unknown state %q", h.State))
	}
	if h.Target < 0 {
		return nil, bad("negative target")
	}
	return &h, nil
}

// memberRec is the value of <base>/rdzv/n/m/<node>.
type memberRec struct {
	Addr string `json:"addr"`
	LWS  int    `json:"lws"`
	// Leaving: the node is draining (Node.Drain); the next round goes on
	// without it, announced to every member as a planned change.
	Leaving bool `json:"leaving,omitempty"`
}

func decodeMember(key string, v []byte) (memberRec, error) {
	var m memberRec
	if err := json.Unmarshal(v, &m); err != nil {
		return m, fmt.Errorf("rendezvous: malformed member record at %s: %w (value %q)", key, err, clip(v))
	}
	if m.LWS <= 0 || checkToken("addr", m.Addr) != nil || m.Addr == "" {
		return m, fmt.Errorf("rendezvous: malformed member record at %s: need a non-empty addr without whitespace and lws > 0 (value %q)", key, clip(v))
	}
	return m, nil
}

// ackRec is the value of <base>/rdzv/n/a/<node>.
type ackRec struct {
	Round int64  `json:"round"`
	Nonce string `json:"nonce"`
	Port  int    `json:"port,omitempty"` // rank 0 only: its chosen MASTER_PORT
}

func decodeAck(key string, v []byte) (ackRec, error) {
	var a ackRec
	if err := json.Unmarshal(v, &a); err != nil {
		return a, fmt.Errorf("rendezvous: malformed acknowledgement at %s: %w (value %q)", key, err, clip(v))
	}
	if a.Round <= 0 || a.Port < 0 || a.Port > 65535 {
		return a, fmt.Errorf("rendezvous: malformed acknowledgement at %s (value %q)", key, clip(v))
	}
	return a, nil
}

// failureRec is the value of <base>/rdzv/n/f/<round>.
type failureRec struct {
	Node   string `json:"node"`
	Detail string `json:"detail,omitempty"`
	// Summary is the reporting node's failure summary (torchrun's
	// ChildFailedError text), carried into the next round's header.
	Summary string `json:"summary,omitempty"`
	// Time is when the node reported it (elasticctl get jobs shows a job
	// Restarting while its last failure is recent).
	Time time.Time `json:"time,omitzero"`
}

func clip(v []byte) string {
	if len(v) > 120 {
		return string(v[:120]) + "..."
	}
	return string(v)
}

// bucket maps a node to the chunk holding its entry.
func bucket(node string, chunks int) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % uint32(chunks))
}

// chunkCount picks how many chunks a round of n nodes is split into: about
// 100 entries each, so a member reads a few KiB whatever the size.
func chunkCount(n int) int {
	return (n + 99) / 100
}

// encodeChunks splits a ranked member list into chunks by bucket. Each line
// is "rank base lws node addr".
func encodeChunks(members []Member, chunks int) [][]byte {
	out := make([][]byte, chunks)
	for _, m := range members {
		b := bucket(m.NodeID, chunks)
		out[b] = fmt.Appendf(out[b], "%d %d %d %s %s\n", m.GroupRank, m.BaseRank, m.LocalWorldSize, m.NodeID, m.Addr)
	}
	for i := range out {
		if out[i] == nil {
			out[i] = []byte{}
		}
	}
	return out
}

// decodeChunk parses a chunk. When only is non-empty it returns just that
// node's entry (or none) and skips parsing the other lines.
func decodeChunk(key string, v []byte, only string, nodes int) ([]Member, error) {
	var out []Member
	s := string(v)
	for len(s) > 0 {
		line, rest, _ := strings.Cut(s, "\n")
		s = rest
		if only != "" && !strings.Contains(line, " "+only+" ") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 5 {
			return nil, fmt.Errorf("rendezvous: malformed round chunk at %s: line %q has %d fields, want 5", key, clip([]byte(line)), len(f))
		}
		var nums [3]int
		for i := range nums {
			n, err := strconv.Atoi(f[i])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("rendezvous: malformed round chunk at %s: line %q: field %d is not a count", key, clip([]byte(line)), i+1)
			}
			nums[i] = n
		}
		m := Member{GroupRank: nums[0], BaseRank: nums[1], LocalWorldSize: nums[2], NodeID: f[3], Addr: f[4]}
		if m.GroupRank >= nodes || m.LocalWorldSize == 0 {
			return nil, fmt.Errorf("rendezvous: malformed round chunk at %s: line %q: rank out of range or zero workers", key, clip([]byte(line)))
		}
		if only != "" {
			if m.NodeID == only {
				return []Member{m}, nil
			}
			continue
		}
		out = append(out, m)
	}
	return out, nil
}
