// Command worker is the small bundled training worker the demo runs when
// PyTorch is not installed. It reads torchrun's environment, "trains" a
// one-parameter model by gradient descent (the loss really decreases), and
// prints rank 0's progress in the same format as examples/pytorch:
// "step=<n> world_size=<w> loss=<float>".
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	steps := flag.Int("steps", 30, "optimizer steps")
	stepTime := flag.Duration("step-time", 50*time.Millisecond, "time per step")
	lr := flag.Float64("lr", 0.1, "learning rate")
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	world, err := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if err != nil || world < 1 {
		fmt.Fprintln(os.Stderr, "worker: WORLD_SIZE is not set: run me under hyperpodrun")
		os.Exit(2)
	}
	// Minimise (w - 3)^2 from w = 0.
	w, target := 0.0, 3.0
	first, last := 0.0, 0.0
	for step := 1; step <= *steps; step++ {
		time.Sleep(*stepTime)
		loss := (w - target) * (w - target)
		w -= *lr * 2 * (w - target)
		if step == 1 {
			first = loss
		}
		last = loss
		if rank == 0 {
			fmt.Printf("step=%d world_size=%d loss=%.6f\n", step, world, loss)
		}
	}
	if rank == 0 {
		fmt.Printf("final: first_loss=%.6f last_loss=%.6f elastic_launched=%v\n", first, last, os.Getenv("TORCHELASTIC_RUN_ID") != "")
	}
}
