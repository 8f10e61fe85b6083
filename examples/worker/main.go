// Command worker is the small bundled training worker the demo runs when
// PyTorch is not installed. It reads torchrun's environment, "trains" a
// one-parameter model by gradient descent (the loss really decreases), and
// prints rank 0's progress in the same format as examples/pytorch:
// "step=<n> world_size=<w> loss=<float>". It speaks hyperpodrun's sync-signal
// protocol: on the elastic signal it saves a checkpoint atomically, rank 0
// reports it committed, and it exits 0; restarted, it resumes from
// HYPERPODRUN_RESUME_STEP.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint"
	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

type state struct {
	Step int     `json:"step"`
	W    float64 `json:"w"`
}

func main() {
	steps := flag.Int("steps", 30, "optimizer steps in total")
	stepTime := flag.Duration("step-time", 50*time.Millisecond, "time per step")
	lr := flag.Float64("lr", 0.05, "learning rate")
	ckptDir := flag.String("ckpt-dir", "", "checkpoint directory (default: none)")
	ckptEvery := flag.Int("ckpt-every", 0, "rank 0 also commits a checkpoint every N steps (0: only on the elastic signal)")
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	world, err := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if err != nil || world < 1 {
		fmt.Fprintln(os.Stderr, "worker: WORLD_SIZE is not set: run me under hyperpodrun")
		os.Exit(2)
	}
	event := make(chan os.Signal, 1)
	signal.Notify(event, syscall.SIGUSR1)

	// Minimise (w - 3)^2 from w = 0, or from the committed checkpoint.
	st := state{}
	if p := os.Getenv("HYPERPODRUN_CHECKPOINT"); p != "" {
		if files, err := checkpoint.ReadDir(p); err == nil {
			json.Unmarshal(files["state.json"], &st)
			if rank == 0 {
				fmt.Printf("resumed at step %d (world size %d)\n", st.Step, world)
			}
		}
	}
	const target = 3.0
	for st.Step < *steps {
		select {
		case <-event:
			save(st, *ckptDir, rank, world)
			os.Exit(0)
		case <-time.After(*stepTime):
		}
		loss := (st.W - target) * (st.W - target)
		st.W -= *lr * 2 * (st.W - target)
		st.Step++
		if rank == 0 {
			fmt.Printf("step=%d world_size=%d loss=%.6f\n", st.Step, world, loss)
			if *ckptEvery > 0 && st.Step%*ckptEvery == 0 {
				commit(st, *ckptDir, rank, world)
			}
		}
	}
	if rank == 0 {
		fmt.Printf("done: %d steps\n", st.Step)
	}
}

// save commits a checkpoint of st (rank 0) and tells the agent this rank
// is stopping.
func save(st state, dir string, rank, world int) {
	commit(st, dir, rank, world)
	sock := os.Getenv("HYPERPODRUN_CONTROL_SOCKET")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if sock != "" {
		control.SendReport(ctx, sock, control.Report{Type: control.ReportStopping, Step: int64(st.Step), Rank: rank, WorldSize: world})
	}
}

// commit writes a checkpoint of st atomically (rank 0) and reports it to the
// agent, which records it as the job's committed checkpoint.
func commit(st state, dir string, rank, world int) {
	if rank != 0 || dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := filepath.Join(dir, fmt.Sprintf("step-%08d", st.Step))
	b, _ := json.Marshal(st)
	if err := checkpoint.WriteDir(path, map[string][]byte{"state.json": b}); err != nil {
		fmt.Fprintln(os.Stderr, "worker: checkpoint:", err)
		return
	}
	if sock := os.Getenv("HYPERPODRUN_CONTROL_SOCKET"); sock != "" {
		if err := control.SendReport(ctx, sock, control.Report{Type: control.ReportCheckpoint, Step: int64(st.Step), Path: path, Rank: rank, WorldSize: world}); err != nil {
			fmt.Fprintln(os.Stderr, "worker: report checkpoint:", err)
		}
	}
}
