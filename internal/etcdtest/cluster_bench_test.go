package etcdtest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// cpu is the CPU time all running members used so far (from /proc).
func (c *Cluster) cpu() time.Duration {
	var sum time.Duration
	for _, m := range c.Members {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.Pid()))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		sum += time.Duration(ut+st) * time.Second / 100
	}
	return sum
}

// load runs op from workers goroutines for d and returns how many
// succeeded.
func load(d time.Duration, workers int, op func(w, i int) error) (ok, failed int64) {
	var okN, failN atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				if op(w, i) == nil {
					okN.Add(1)
				} else {
					failN.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return okN.Load(), failN.Load()
}

// BenchmarkClusterBudget measures what one 3-member etcd cluster of
// Debian's etcd (fsync on, loopback) takes: puts per second from 64
// writers, keys per second in 100-put transactions (the coordinator's
// batches), lease keep-alives per second, and watch events per second to
// 1,000 watches (one per simulated node agent), each with the members'
// CPU per operation. Run it once:
//
//	go test -run '^$' -bench BenchmarkClusterBudget -benchtime=1x ./internal/etcdtest
func BenchmarkClusterBudget(b *testing.B) {
	c := StartCluster(b, 3)
	cli := c.Client()
	const window = 4 * time.Second
	val := strings.Repeat("x", 200)
	op := func(timeout time.Duration, f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return f(ctx)
	}
	report := func(name string, ok, failed int64, cpu time.Duration, unit string) {
		perSec := float64(ok) / window.Seconds()
		cpuPer := float64(cpu.Microseconds()) / float64(max(ok, 1))
		b.ReportMetric(perSec, name+"_"+unit+"/s")
		b.ReportMetric(cpuPer, name+"_etcd_cpu_us/"+unit)
		fmt.Printf("BENCH etcd3_%s_per_s %.0f %s/s (failed %d; 3 members' CPU %.0f us per %s; load %s)\n", name, perSec, unit, failed, cpuPer, unit, loadavg())
	}
	for i := 0; i < b.N; i++ {
		// Single puts, 64 writers.
		cpu0 := c.cpu()
		ok, failed := load(window, 64, func(w, i int) error {
			return op(5*time.Second, func(ctx context.Context) error {
				_, err := cli.Put(ctx, fmt.Sprintf("put/%02d/%06d", w, i), val)
				return err
			})
		})
		report("put", ok, failed, c.cpu()-cpu0, "put")

		// 100-put transactions, 4 writers: keys per second.
		cpu0 = c.cpu()
		ok, failed = load(window, 4, func(w, i int) error {
			ops := make([]clientv3.Op, 100)
			for k := range ops {
				ops[k] = clientv3.OpPut(fmt.Sprintf("txn/%d/%06d/%03d", w, i, k), val)
			}
			return op(5*time.Second, func(ctx context.Context) error {
				_, err := cli.Txn(ctx).Then(ops...).Commit()
				return err
			})
		})
		report("txn100_keys", ok*100, failed, c.cpu()-cpu0, "key")

		// Lease keep-alives: 2,000 leases renewed by 32 goroutines.
		var leases []clientv3.LeaseID
		for l := 0; l < 2000; l++ {
			if err := op(5*time.Second, func(ctx context.Context) error {
				r, err := cli.Grant(ctx, 60)
				if err == nil {
					leases = append(leases, r.ID)
				}
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
		cpu0 = c.cpu()
		ok, failed = load(window, 32, func(w, i int) error {
			return op(5*time.Second, func(ctx context.Context) error {
				_, err := cli.KeepAliveOnce(ctx, leases[(w*997+i)%len(leases)])
				return err
			})
		})
		report("keepalive", ok, failed, c.cpu()-cpu0, "keepalive")

		// Watch events: 1,000 watches on their own prefixes (a node agent's
		// assignments), 4 writers putting to them in 100-put transactions
		// (compare the CPU per event with txn100_keys': the difference is
		// the delivery).
		wctx, wcancel := context.WithCancel(context.Background())
		var events atomic.Int64
		var wg sync.WaitGroup
		for n := 0; n < 1000; n++ {
			wch := cli.Watch(wctx, fmt.Sprintf("assign/node-%04d/", n), clientv3.WithPrefix())
			wg.Add(1)
			go func() {
				defer wg.Done()
				for wr := range wch {
					events.Add(int64(len(wr.Events)))
				}
			}()
		}
		time.Sleep(time.Second) // the watches are registered
		cpu0 = c.cpu()
		ev0 := events.Load()
		ok, failed = load(window, 4, func(w, i int) error {
			ops := make([]clientv3.Op, 100)
			for k := range ops {
				ops[k] = clientv3.OpPut(fmt.Sprintf("assign/node-%04d/job-%d-%d", (i*100+k)%1000, w, i), val)
			}
			return op(5*time.Second, func(ctx context.Context) error {
				_, err := cli.Txn(ctx).Then(ops...).Commit()
				return err
			})
		})
		ok *= 100
		time.Sleep(500 * time.Millisecond) // the last events are delivered
		report("watch_events", events.Load()-ev0, failed, c.cpu()-cpu0, "event")
		if got := events.Load() - ev0; got < ok {
			b.Errorf("%d puts under watch, %d events delivered", ok, got)
		}
		wcancel()
		wg.Wait()
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
