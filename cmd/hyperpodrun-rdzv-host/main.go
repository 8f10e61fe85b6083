// Command hyperpodrun-rdzv-host serves a c10d-style rendezvous for
// hyperpodrun: an embedded etcd listening on --rdzv-endpoint's host:port.
// hyperpodrun starts it on the node that owns that address; it is a separate
// program so that hyperpodrun itself does not carry (and initialise at every
// launch) an etcd server.
//
// Usage: hyperpodrun-rdzv-host HOST:PORT
//
// It prints "ready <endpoint>" on stdout once etcd serves, or "in-use" when
// the address is taken (another hyperpodrun of this machine hosts it), and
// runs until stdin is closed or it receives SIGTERM/SIGINT. Exit codes: 0,
// 1 (failed), 2 (bad usage), 3 (address in use).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	const usage = "usage: hyperpodrun-rdzv-host HOST:PORT (started by hyperpodrun --rdzv-backend c10d)"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Fprintln(stdout, usage)
		return 0
	}
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	// Die with hyperpodrun: losing the host's hyperpodrun loses the rendezvous.
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	srv, err := etcdembed.Start(ctx, etcdembed.Options{ClientAddr: args[0], UnsafeNoFsync: true})
	cancel()
	if errors.Is(err, syscall.EADDRINUSE) {
		fmt.Fprintln(stdout, "in-use")
		return 3
	}
	if err != nil {
		fmt.Fprintf(stderr, "hyperpodrun-rdzv-host: %v\n", err)
		return 1
	}
	defer srv.Close()
	fmt.Fprintf(stdout, "ready %s\n", srv.Endpoints[0])
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	eof := make(chan struct{})
	go func() { io.Copy(io.Discard, stdin); close(eof) }()
	select {
	case <-sigs:
	case <-eof:
	}
	return 0
}
