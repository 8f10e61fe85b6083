package main

import (
	"testing"
	"time"
)

// With 3 members the deck holds the member faults (the leader kill twice),
// each keeping its member(s) down for its range; with one member none.
func TestMemberFaultsAreDealtWithThreeMembers(t *testing.T) {
	three := config{etcdMembers: 3}
	p := plan(3, 60*time.Minute, 15*time.Second, 40*time.Second, 30*time.Second, three.memberKinds()...)
	deck := len(faultKinds) + len(memberFaultKinds)
	count := map[string]int{}
	for _, f := range p[:deck] {
		count[f.kind]++
		lo, hi := time.Duration(0), time.Duration(0)
		switch f.kind {
		case faultLeaderKill:
			lo, hi = time.Second, leaderDownMax
		case faultMemberDown:
			lo, hi = memberDownMin, memberDownMax
		case faultMemberDisk:
			lo, hi = diskFullMin, diskFullMax
		case faultQuorumLoss:
			lo, hi = quorumLossFor, quorumLossFor
		default:
			continue
		}
		if f.down < lo || f.down > hi {
			t.Errorf("%v: down out of %s-%s", f, lo, hi)
		}
	}
	if count[faultLeaderKill] != 2 || count[faultMemberDown] != 1 || count[faultMemberDisk] != 1 || count[faultQuorumLoss] != 1 {
		t.Errorf("first deck of a 3-member soak: %v", count)
	}
	one := config{etcdMembers: 1}
	for _, f := range plan(3, 60*time.Minute, 15*time.Second, 40*time.Second, 30*time.Second, one.memberKinds()...) {
		for _, k := range memberFaultKinds {
			if f.kind == k {
				t.Fatalf("a 1-member soak dealt %v", f)
			}
		}
	}
}

// A member fault waits while another holds its member(s) down.
func TestClusterClaim(t *testing.T) {
	var c cluster
	if err := c.claim(faultMemberDown); err != nil {
		t.Fatal(err)
	}
	if err := c.claim(faultLeaderKill); err == nil {
		t.Fatal("a leader kill was let through while a member is down (quorum would be lost)")
	}
	c.release()
	if err := c.claim(faultLeaderKill); err != nil {
		t.Fatalf("after the member came back: %v", err)
	}
}

// The report counts each member fault once with 3 members, none with one.
func TestReportKinds(t *testing.T) {
	if got, want := len(config{etcdMembers: 3}.reportKinds()), len(faultKinds)+4; got != want {
		t.Errorf("3 members: %d kinds reported, want %d", got, want)
	}
	if got := len(config{etcdMembers: 1}.reportKinds()); got != len(faultKinds) {
		t.Errorf("1 member: %d kinds reported, want %d", got, len(faultKinds))
	}
}
