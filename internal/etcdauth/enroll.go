package etcdauth

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/nacl/box"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Enrollment hands each hyperpod-agent pod of a Kubernetes DaemonSet its
// own node's etcd user (hyperpod-node-<node>), which a DaemonSet cannot
// mount as a per-node Secret:
//
//  1. the agent, as the shared EnrollUser (which may write enroll/ and read
//     enroll-replies/, nothing else), writes enroll/<node> = its pod-bound
//     ServiceAccount token (audience EnrollAudience) and a fresh X25519
//     public key, under a short lease, and watches enroll-replies/<node>;
//  2. hyperpod-kube-controller checks the token with a TokenReview (the
//     agent DaemonSet's ServiceAccount, bound to a live pod on <node>) and
//     writes enroll-approved/<node> = the public key (only it may);
//  3. the coordinator (etcd root: only root creates users) creates or
//     re-passwords hyperpod-node-<node> and writes the password sealed to
//     the approved key at enroll-replies/<node>; only the requester opens it.

// EnrollAudience is the audience of the agent pods' projected
// ServiceAccount token: a token for the API server (or anything else) is
// refused, and an enrollment token is no good to the API server.
const EnrollAudience = "hyperpodrun-enroll"

// Lease TTLs of the enrollment records: a request, approval or reply
// nobody took up disappears by itself.
const (
	EnrollApprovalTTL = 60  // seconds
	EnrollReplyTTL    = 120 // seconds
)

// EnrollRequest is enroll/<node>.
type EnrollRequest struct {
	Node string `json:"node"`
	// Token is the pod's projected ServiceAccount token (EnrollAudience).
	Token string `json:"token"`
	// PublicKey is the requester's X25519 key (32 bytes) to seal to.
	PublicKey []byte `json:"publicKey"`
}

// EnrollApproval is enroll-approved/<node>.
type EnrollApproval struct {
	Node      string `json:"node"`
	PublicKey []byte `json:"publicKey"`
	// Pod is the approved pod (namespace/name) and PodUID its uid: what
	// the coordinator logs.
	Pod    string    `json:"pod,omitempty"`
	PodUID string    `json:"podUID,omitempty"`
	Time   time.Time `json:"time"`
}

// EnrollReply is enroll-replies/<node>.
type EnrollReply struct {
	Node string `json:"node"`
	User string `json:"user"`
	// Sealed is the password, box.SealAnonymous to the approved key.
	Sealed []byte `json:"sealed"`
}

// ValidEnrollKey reports whether k is a public key's length.
func ValidEnrollKey(k []byte) bool { return len(k) == 32 }

// Enrolled is what Enroll returns: the node's own etcd user.
type Enrolled struct {
	User, Password string
}

// ErrEnrollTimeout: no reply came before the context ended.
var ErrEnrollTimeout = errors.New("no enrollment reply")

// Enroll asks for node's etcd user with the pod's ServiceAccount token and
// waits (until ctx ends) for the coordinator's sealed reply. cli is the
// shared EnrollUser's. The request is deleted (its lease revoked) when
// Enroll returns.
func Enroll(ctx context.Context, cli *clientv3.Client, k fleet.Keys, node, token string) (*Enrolled, error) {
	if err := api.ValidateNodeName(node); err != nil {
		return nil, err
	}
	if token == "" {
		return nil, errors.New("enroll: empty ServiceAccount token")
	}
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("enroll: key pair: %w", err)
	}
	var rev int64
	if err := call(ctx, func(ctx context.Context) error {
		r, err := cli.Get(ctx, k.EnrollReply(node), clientv3.WithKeysOnly())
		if err == nil {
			rev = r.Header.Revision
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("enroll: read %s: %w", k.EnrollReply(node), err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, k.EnrollReply(node), clientv3.WithRev(rev+1))

	ttl := int64(EnrollReplyTTL)
	if dl, ok := ctx.Deadline(); ok {
		ttl = max(ttl, int64(time.Until(dl)/time.Second)+5)
	}
	lease, err := grant(ctx, cli, ttl)
	if err != nil {
		return nil, fmt.Errorf("enroll: lease: %w", err)
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		_, _ = cli.Revoke(rctx, lease)
	}()
	req, err := json.Marshal(EnrollRequest{Node: node, Token: token, PublicKey: pub[:]})
	if err != nil {
		return nil, err
	}
	if err := call(ctx, func(ctx context.Context) error {
		_, err := cli.Put(ctx, k.Enroll(node), string(req), clientv3.WithLease(lease))
		return err
	}); err != nil {
		return nil, fmt.Errorf("enroll: write the request %s: %w", k.Enroll(node), err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w for node %s (%v): hyperpod-kube-controller refused the request (its log and `kubectl describe node %s` say why: the token must be a pod of the agent DaemonSet's ServiceAccount on this node), or no controller or coordinator with enrollment is running",
				ErrEnrollTimeout, node, ctx.Err(), node)
		case wr, ok := <-wch:
			if !ok {
				return nil, fmt.Errorf("enroll: watch of %s closed: %w", k.EnrollReply(node), ctx.Err())
			}
			if err := wr.Err(); err != nil {
				return nil, fmt.Errorf("enroll: watch %s: %w", k.EnrollReply(node), err)
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				if got, ok := openReply(ev.Kv.Value, node, pub, priv); ok {
					return got, nil
				}
			}
		}
	}
}

// openReply opens a reply sealed to pub; ok is false for another
// requester's (an earlier pod's) reply or a malformed one.
func openReply(v []byte, node string, pub, priv *[32]byte) (*Enrolled, bool) {
	var r EnrollReply
	if json.Unmarshal(v, &r) != nil || r.Node != node || r.User != NodeRole(node) {
		return nil, false
	}
	pw, ok := box.OpenAnonymous(nil, r.Sealed, pub, priv)
	if !ok || len(pw) == 0 {
		return nil, false
	}
	return &Enrolled{User: r.User, Password: string(pw)}, true
}

// grant grants a lease of ttl seconds, within call's deadline.
func grant(ctx context.Context, cli *clientv3.Client, ttl int64) (clientv3.LeaseID, error) {
	var id clientv3.LeaseID
	err := call(ctx, func(ctx context.Context) error {
		l, err := cli.Grant(ctx, ttl)
		if err == nil {
			id = l.ID
		}
		return err
	})
	return id, err
}

// setUser creates user (its role named as it) with password pw, or sets
// pw on the existing user, and grants it its role.
func setUser(ctx context.Context, cli *clientv3.Client, user, pw string) error {
	err := call(ctx, func(ctx context.Context) error { _, err := cli.UserAdd(ctx, user, pw); return err })
	if already(err) {
		err = call(ctx, func(ctx context.Context) error { _, err := cli.UserChangePassword(ctx, user, pw); return err })
	}
	if err != nil {
		return fmt.Errorf("create user %s: %w", user, err)
	}
	if err := call(ctx, func(ctx context.Context) error { _, err := cli.UserGrantRole(ctx, user, user); return err }); err != nil {
		return fmt.Errorf("grant user %s its role: %w", user, err)
	}
	return nil
}

// IssueEnrollment answers one approval (the value of enroll-approved/<node>
// at modRev): it gives node's user (NodeRoleFor: created with its role
// when it does not exist) a new password, and writes it sealed to the
// approved key at enroll-replies/<node> under a short lease while
// deleting the approval, in one transaction that holds only while the
// approval is the one read. The password reset and the reply run within
// within (nil: at once), after the role is in place: its check comes
// last before the reset. cli must have etcd's root role.
func IssueEnrollment(ctx context.Context, cli *clientv3.Client, k fleet.Keys, node string, value []byte, modRev int64, within Within) error {
	var a EnrollApproval
	if err := json.Unmarshal(value, &a); err != nil {
		return fmt.Errorf("approval %s: %w", k.EnrollApproved(node), err)
	}
	if a.Node != node || !ValidEnrollKey(a.PublicKey) {
		return fmt.Errorf("approval %s: names node %q or has a %d-byte key", k.EnrollApproved(node), a.Node, len(a.PublicKey))
	}
	r, err := NodeRoleFor(k, node)
	if err != nil {
		return err
	}
	if err := ensureRole(ctx, cli, r); err != nil {
		return err
	}
	pw, err := NewPassword()
	if err != nil {
		return err
	}
	var pub [32]byte
	copy(pub[:], a.PublicKey)
	sealed, err := box.SealAnonymous(nil, []byte(pw), &pub, rand.Reader)
	if err != nil {
		return fmt.Errorf("seal node %s's password: %w", node, err)
	}
	v, err := json.Marshal(EnrollReply{Node: node, User: NodeRole(node), Sealed: sealed})
	if err != nil {
		return err
	}
	if within == nil {
		within = atOnce
	}
	return within(ctx, func(ctx context.Context) error {
		if err := setUser(ctx, cli, r.Name, pw); err != nil {
			return fmt.Errorf("node %s's etcd user: %w", node, err)
		}
		lease, err := grant(ctx, cli, EnrollReplyTTL)
		if err != nil {
			return fmt.Errorf("enrollment reply lease: %w", err)
		}
		return call(ctx, func(ctx context.Context) error {
			_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.EnrollApproved(node)), "=", modRev)).
				Then(clientv3.OpPut(k.EnrollReply(node), string(v), clientv3.WithLease(lease)), clientv3.OpDelete(k.EnrollApproved(node))).Commit()
			if err != nil {
				return fmt.Errorf("write node %s's enrollment reply: %w", node, err)
			}
			return nil
		})
	})
}

// Within runs f while its caller may still change etcd's users: a
// coordinator's term, while its lease provably lasts. It returns an error
// without running f once the caller may not (f's own error otherwise).
// etcd's users cannot be changed in a transaction, so no leadership
// compare guards a password reset.
type Within func(ctx context.Context, f func(context.Context) error) error

// atOnce is the Within of a caller that may always change users.
func atOnce(ctx context.Context, f func(context.Context) error) error { return f(ctx) }

// ServeEnrollments answers every approved enrollment (enroll-approved/),
// those already there and those to come, until ctx ends: the coordinator
// runs it while it leads. cli must have etcd's root role. Each answer's
// password reset runs within within (nil: at once): a leader deposed
// without knowing yet would otherwise reset the password of a node the
// new leader has just enrolled. An approval within refuses is read again
// after a backoff while ctx lasts, and otherwise stays (for its lease,
// EnrollApprovalTTL) for the next leader.
func ServeEnrollments(ctx context.Context, cli *clientv3.Client, k fleet.Keys, log *slog.Logger, within Within) {
	if log == nil {
		log = slog.Default()
	}
	if within == nil {
		within = atOnce
	}
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		err := serveEnrollments(ctx, cli, k, log, within)
		if ctx.Err() != nil {
			return
		}
		log.Warn("enrollment watch ended; starting over", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func serveEnrollments(ctx context.Context, cli *clientv3.Client, k fleet.Keys, log *slog.Logger, within Within) error {
	p := k.EnrollApprovedPrefix()
	var got *clientv3.GetResponse
	if err := call(ctx, func(ctx context.Context) error {
		var err error
		got, err = cli.Get(ctx, p, clientv3.WithPrefix())
		return err
	}); err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	// issue answers one approval. An answer within refused (it ran
	// nothing) is tried again: the error makes ServeEnrollments read every
	// approval again after its backoff (a term a renewal moved goes on).
	issue := func(key string, value []byte, modRev int64) error {
		node := key[len(p):]
		var asked, ran bool
		err := IssueEnrollment(ctx, cli, k, node, value, modRev, func(ctx context.Context, f func(context.Context) error) error {
			asked = true
			return within(ctx, func(ctx context.Context) error { ran = true; return f(ctx) })
		})
		if err != nil && asked && !ran && ctx.Err() == nil {
			log.Warn("cannot answer a node's enrollment now; reading the approvals again", "key", fleet.ClipKey(key), "err", err)
			return fmt.Errorf("answer node %s's enrollment: %w", node, err)
		}
		if err != nil {
			log.Warn("cannot answer a node's enrollment", "key", fleet.ClipKey(key), "err", err)
			return nil
		}
		log.Info("enrolled a node: its etcd user has a new password, sealed to its agent pod", "node", node, "user", NodeRole(node))
		return nil
	}
	for _, kv := range got.Kvs {
		if err := issue(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(got.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if err := issue(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision); err != nil {
				return err
			}
		}
	}
	return errors.New("watch closed")
}
