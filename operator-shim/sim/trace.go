package sim

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TraceJob is one job of a trace.
type TraceJob struct {
	// Name is unique within the trace.
	Name string `json:"name"`
	// Team submits the job (it must exist in the teams file).
	Team string `json:"team"`
	// Submit is the arrival time in seconds from the start of the trace.
	Submit float64 `json:"submit"`
	// Flavor is the accelerator flavor ("" = the team's only flavor).
	Flavor string `json:"flavor,omitempty"`
	// GPUsPerNode is the accelerators the job uses on each node (>= 1).
	GPUsPerNode int `json:"gpusPerNode"`
	// Nodes is the size the job would have asked for statically (default
	// MinNodes); the FIFO baseline runs every job at this size.
	Nodes int `json:"nodes,omitempty"`
	// MinNodes and MaxNodes bound an elastic job (default Nodes).
	MinNodes int `json:"minNodes,omitempty"`
	MaxNodes int `json:"maxNodes,omitempty"`
	// Step between sizes (default 1).
	Step int `json:"step,omitempty"`
	// Elastic jobs may be resized between MinNodes and MaxNodes.
	Elastic bool `json:"elastic,omitempty"`
	// Priority 0-99 (nil: 50).
	Priority *int `json:"priority,omitempty"`
	// Work is the job's total work in GPU-seconds: a job holding g GPUs
	// finishes after Work/g seconds of productive time (linear scaling).
	Work float64 `json:"work"`
}

// StaticNodes is the static size (Nodes, else MinNodes, else 1).
func (t TraceJob) StaticNodes() int {
	switch {
	case t.Nodes > 0:
		return t.Nodes
	case t.MinNodes > 0:
		return t.MinNodes
	}
	return 1
}

// Validate checks one trace job.
func (t TraceJob) Validate() error {
	var errs []string
	if t.Name == "" {
		errs = append(errs, "name: must be set")
	}
	if t.Team == "" {
		errs = append(errs, "team: must be set")
	}
	if t.Submit < 0 || t.Submit != t.Submit {
		errs = append(errs, fmt.Sprintf("submit: must be >= 0 seconds (got %v)", t.Submit))
	}
	if t.GPUsPerNode < 1 {
		errs = append(errs, fmt.Sprintf("gpusPerNode: must be >= 1 (got %d)", t.GPUsPerNode))
	}
	if !(t.Work > 0) {
		errs = append(errs, fmt.Sprintf("work: must be > 0 GPU-seconds (got %v)", t.Work))
	}
	if t.Nodes < 0 || t.MinNodes < 0 || t.MaxNodes < 0 || t.Step < 0 {
		errs = append(errs, "nodes, minNodes, maxNodes, step: must be >= 0")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// csvColumns are the CSV trace columns, in the order WriteCSV writes them.
var csvColumns = []string{"name", "team", "submit", "flavor", "gpus_per_node", "nodes", "min_nodes", "max_nodes", "step", "elastic", "priority", "work"}

// LoadTrace reads a trace file: CSV when the name ends in .csv, JSON lines
// otherwise.
func LoadTrace(path string) ([]TraceJob, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	format := "jsonl"
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		format = "csv"
	}
	return ReadTrace(f, format, path)
}

// ReadTrace parses a trace in format "jsonl" or "csv" ("" sniffs: a first
// non-blank character '{' means JSON lines). name prefixes errors
// ("trace.csv:12: ...").
func ReadTrace(r io.Reader, format, name string) ([]TraceJob, error) {
	br := bufio.NewReader(r)
	if format == "" {
		format = "csv"
		for {
			b, err := br.Peek(1)
			if err != nil {
				break
			}
			if b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t' {
				br.ReadByte()
				continue
			}
			if b[0] == '{' {
				format = "jsonl"
			}
			break
		}
	}
	var out []TraceJob
	var err error
	switch format {
	case "jsonl", "json":
		out, err = readJSONL(br, name)
	case "csv":
		out, err = readCSV(br, name)
	default:
		return nil, fmt.Errorf("%s: unknown trace format %q (want jsonl or csv)", name, format)
	}
	if err != nil {
		return nil, err
	}
	return out, checkTrace(out, name)
}

func checkTrace(jobs []TraceJob, name string) error {
	seen := make(map[string]int, len(jobs))
	for i, j := range jobs {
		if err := j.Validate(); err != nil {
			return fmt.Errorf("%s: job %d (%q): %v", name, i+1, j.Name, err)
		}
		if k, dup := seen[j.Name]; dup {
			return fmt.Errorf("%s: job %d: name %q already used by job %d", name, i+1, j.Name, k+1)
		}
		seen[j.Name] = i
	}
	return nil
}

func readJSONL(r io.Reader, name string) ([]TraceJob, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []TraceJob
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var j TraceJob
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		out = append(out, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %v", name, line+1, err)
	}
	return out, nil
}

func readCSV(r io.Reader, name string) ([]TraceJob, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s:1: reading the header: %v", name, err)
	}
	col := map[string]int{}
	for i, h := range header {
		h = strings.TrimSpace(strings.ToLower(h))
		known := false
		for _, c := range csvColumns {
			known = known || c == h
		}
		if !known {
			return nil, fmt.Errorf("%s:1: unknown column %q (known: %s)", name, h, strings.Join(csvColumns, ","))
		}
		col[h] = i
	}
	for _, c := range []string{"name", "team", "submit", "gpus_per_node", "work"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("%s:1: missing required column %q", name, c)
		}
	}
	var out []TraceJob
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		get := func(c string) string {
			if i, ok := col[c]; ok && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		var j TraceJob
		var perr error
		num := func(c string) float64 {
			s := get(c)
			if s == "" || perr != nil {
				return 0
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				perr = fmt.Errorf("%s:%d: column %s: invalid number %q", name, line, c, s)
			}
			return v
		}
		integer := func(c string) int {
			v := num(c)
			if perr == nil && v != float64(int(v)) {
				perr = fmt.Errorf("%s:%d: column %s: want a whole number, got %v", name, line, c, v)
			}
			return int(v)
		}
		j.Name, j.Team, j.Flavor = get("name"), get("team"), get("flavor")
		j.Submit = num("submit")
		j.GPUsPerNode = integer("gpus_per_node")
		j.Nodes, j.MinNodes, j.MaxNodes, j.Step = integer("nodes"), integer("min_nodes"), integer("max_nodes"), integer("step")
		j.Work = num("work")
		switch e := strings.ToLower(get("elastic")); e {
		case "", "false", "0", "no":
		case "true", "1", "yes":
			j.Elastic = true
		default:
			return nil, fmt.Errorf("%s:%d: column elastic: want true or false, got %q", name, line, e)
		}
		if get("priority") != "" {
			p := integer("priority")
			j.Priority = &p
		}
		if perr != nil {
			return nil, perr
		}
		out = append(out, j)
	}
	return out, nil
}

// WriteJSONL writes the trace as JSON lines.
func WriteJSONL(w io.Writer, jobs []TraceJob) error {
	enc := json.NewEncoder(w)
	for _, j := range jobs {
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

// WriteCSV writes the trace as CSV with a header.
func WriteCSV(w io.Writer, jobs []TraceJob) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvColumns); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, j := range jobs {
		p := ""
		if j.Priority != nil {
			p = strconv.Itoa(*j.Priority)
		}
		rec := []string{j.Name, j.Team, f(j.Submit), j.Flavor, strconv.Itoa(j.GPUsPerNode), strconv.Itoa(j.Nodes),
			strconv.Itoa(j.MinNodes), strconv.Itoa(j.MaxNodes), strconv.Itoa(j.Step), strconv.FormatBool(j.Elastic), p, f(j.Work)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
