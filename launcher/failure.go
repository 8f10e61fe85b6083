package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Failure is one worker that exited non-zero or by a signal.
type Failure struct {
	LocalRank int
	Rank      int
	PID       int
	Host      string
	ExitCode  int            // negative signal number when killed, as torchrun reports
	Signal    syscall.Signal // 0 unless killed by a signal
	Time      time.Time      // error.json timestamp, else when the exit was seen
	ErrorFile string         // TORCHELASTIC_ERROR_FILE given to the worker
	HasError  bool           // the worker wrote ErrorFile (torch's @record)
	Message   string         // the exception ("RuntimeError: ...")
	Traceback string
}

// Result is how an attempt ended: no failures means success.
type Result struct {
	Failures  []Failure // by rank
	RootCause *Failure  // first failure by time
	MaxRSSKiB int64     // largest worker peak RSS
}

// OK reports whether every worker exited 0.
func (r Result) OK() bool { return len(r.Failures) == 0 }

// errorFileJSON is what torch.distributed.elastic's @record writes.
type errorFileJSON struct {
	Message json.RawMessage `json:"message"`
}

type errorMessage struct {
	Message   string `json:"message"`
	ExtraInfo struct {
		PyCallstack string `json:"py_callstack"`
		Timestamp   string `json:"timestamp"`
	} `json:"extraInfo"`
}

// readErrorFile fills Message, Traceback and Time from torch's error.json.
// A missing file is normal (the worker did not use @record); a malformed one
// is reported in Message rather than failing the summary.
func (f *Failure) readErrorFile() {
	if f.ErrorFile == "" {
		return
	}
	b, err := os.ReadFile(f.ErrorFile)
	if err != nil {
		return
	}
	f.HasError = true
	var ef errorFileJSON
	if err := json.Unmarshal(b, &ef); err != nil || len(ef.Message) == 0 {
		f.Message = fmt.Sprintf("unreadable error file %s: %v", f.ErrorFile, err)
		return
	}
	var m errorMessage
	if err := json.Unmarshal(ef.Message, &m); err != nil {
		var s string
		if json.Unmarshal(ef.Message, &s) == nil {
			f.Message = s
			return
		}
		f.Message = fmt.Sprintf("unreadable error file %s: %v", f.ErrorFile, err)
		return
	}
	f.Message = m.Message
	f.Traceback = m.ExtraInfo.PyCallstack
	if ts, err := strconv.ParseInt(m.ExtraInfo.Timestamp, 10, 64); err == nil && ts > 0 {
		f.Time = time.Unix(ts, 0)
	}
}

// Summary renders the failures the way torchrun's ChildFailedError does.
func (r Result) Summary(title string) string {
	const width = 60
	var b strings.Builder
	b.WriteString(strings.Repeat("=", width) + "\n")
	b.WriteString(title + " FAILED\n")
	b.WriteString(strings.Repeat("-", width) + "\n")
	b.WriteString("Failures:\n")
	// As torch's ChildFailedError: every failed rank, numbered in rank
	// order; the first to fail is the root cause, the others are listed
	// above it.
	others, rootIdx := 0, 0
	for i := range r.Failures {
		if &r.Failures[i] == r.RootCause || (r.RootCause != nil && r.Failures[i].Rank == r.RootCause.Rank) {
			rootIdx = i
			continue
		}
		others++
		r.Failures[i].format(&b, i)
	}
	if others == 0 {
		b.WriteString("  <NO_OTHER_FAILURES>\n")
	}
	b.WriteString(strings.Repeat("-", width) + "\n")
	b.WriteString("Root Cause (first observed failure):\n")
	if r.RootCause != nil {
		r.RootCause.format(&b, rootIdx)
	}
	b.WriteString(strings.Repeat("=", width) + "\n")
	return b.String()
}

func (f *Failure) format(b *strings.Builder, idx int) {
	errFile := f.ErrorFile
	if !f.HasError {
		errFile = "<N/A>"
	}
	tb := f.Traceback
	switch {
	case f.Signal != 0:
		tb = fmt.Sprintf("Signal %d (%s) received by PID %d", int(f.Signal), SignalName(f.Signal), f.PID)
	case tb == "" && f.Message != "":
		tb = f.Message
	case tb == "":
		tb = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
	}
	fmt.Fprintf(b, "[%d]:\n", idx)
	fmt.Fprintf(b, "  time      : %s\n", f.Time.Format("2006-01-02_15:04:05"))
	fmt.Fprintf(b, "  host      : %s\n", f.Host)
	fmt.Fprintf(b, "  rank      : %d (local_rank: %d)\n", f.Rank, f.LocalRank)
	fmt.Fprintf(b, "  exitcode  : %d (pid: %d)\n", f.ExitCode, f.PID)
	fmt.Fprintf(b, "  error_file: %s\n", errFile)
	fmt.Fprintf(b, "  traceback : %s\n", strings.ReplaceAll(strings.TrimRight(tb, "\n"), "\n", "\n  "))
}
