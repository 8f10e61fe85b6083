package rendezvous

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The closer keeps the counts decide reads (available and draining
// members) as members come, change, turn suspect and go, instead of
// counting them on every decision. After any sequence of those, the kept
// counts must be what counting the members one by one gives.
func TestCloserKeepsItsCountsAsMembersChange(t *testing.T) {
	k := newKeys("/p", "job")
	c := &closer{
		k: k, log: slog.New(slog.DiscardHandler), cfg: &Config{},
		members: map[string]*cand{}, inRound: map[string]int{}, lostSet: map[string]bool{}, acked: map[string]ackRec{},
	}
	put := func(id string, leaving bool) {
		v := fmt.Sprintf(`{"addr":"%s.example","lws":2,"leaving":%t}`, id, leaving)
		c.apply(&clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(k.Member(id)), Value: []byte(v), CreateRevision: 1}})
	}
	del := func(id string) {
		c.apply(&clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(k.Member(id))}})
	}
	ack := func(id string) {
		c.apply(&clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(k.Ack(id)), Value: []byte(`{"round":1,"nonce":"x"}`)}})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for step := range 5000 {
		id := fmt.Sprintf("n%02d", r.IntN(40))
		switch op := r.IntN(6); op {
		case 0, 1:
			put(id, false)
		case 2:
			put(id, true)
		case 3:
			del(id)
		case 4:
			if m := c.members[id]; m != nil {
				c.setSuspect(m, true)
			}
		case 5:
			ack(id) // a late acknowledgement clears a suspicion
		}
		v := c.view()
		avail, draining := tally(c.members)
		suspects := 0
		for _, m := range c.members {
			suspects += b2i(m.suspect)
		}
		if v.avail != avail || v.draining != draining || c.suspects != suspects {
			t.Fatalf("step %d: kept counts available %d, draining %d, suspects %d; counted %d, %d, %d",
				step, v.avail, v.draining, c.suspects, avail, draining, suspects)
		}
	}
}
