package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/sim"
)

// doc is one YAML document with its node tree, for field line lookups.
type doc struct {
	file  string
	data  []byte
	index int
	node  *yaml.Node
}

// maxFileSize bounds a job or team file: etcd refuses values past 1.5 MiB
// anyway, and a larger file costs seconds and hundreds of MiB to parse.
const maxFileSize = 1 << 20

// readFile reads a job or team file ("-" is standard input), refusing one
// over maxFileSize at once.
func readFile(file string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: larger than 1 MiB: split it into several files (one job per document is enough)", file)
	}
	return data, nil
}

// readDocs splits a (multi-document) YAML file. "-" reads standard input.
func readDocs(file string) ([]doc, error) {
	data, err := readFile(file)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []doc
	for {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
		}
		if len(n.Content) == 0 {
			continue
		}
		out = append(out, doc{file, data, len(out), &n})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no YAML document found", file)
	}
	return out, nil
}

// decode decodes strictly from the file's own bytes (so line numbers are
// the file's): unknown fields and wrong types are errors naming file, line
// and field.
func (d doc) decode(v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(d.data))
	dec.KnownFields(true)
	for i := 0; i < d.index; {
		var skip yaml.Node
		if err := dec.Decode(&skip); err != nil {
			return err
		}
		if len(skip.Content) > 0 {
			i++
		}
	}
	for {
		err := dec.Decode(v)
		if err == nil {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: document %d is missing", d.file, d.index+1)
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var msgs []string
			for _, e := range te.Errors {
				// "line 4: cannot unmarshal ..." -> "f.yaml:4: perNode.accelerators: cannot unmarshal ..."
				rest := strings.TrimPrefix(e, "line ")
				if num, msg, ok := strings.Cut(rest, ": "); ok {
					if line, err := strconv.Atoi(num); err == nil {
						if path := d.pathAtLine(line); path != "" && !strings.HasPrefix(msg, "field ") {
							rest = num + ": " + path + ": " + msg
						}
					}
				}
				msgs = append(msgs, d.file+":"+rest)
			}
			return errors.New(strings.Join(msgs, "\n"))
		}
		return fmt.Errorf("%s: %s", d.file, strings.TrimPrefix(err.Error(), "yaml: "))
	}
}

// root is the document's top node.
func (d doc) root() *yaml.Node {
	n := d.node
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	return n
}

// fieldLine finds the line of a dotted field path ("perNode.accelerators"):
// the deepest part of it that the file has.
func (d doc) fieldLine(path string) int {
	n := d.root()
	line := n.Line
	for _, part := range strings.Split(path, ".") {
		if n.Kind != yaml.MappingNode {
			break
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == part {
				line = n.Content[i].Line
				n = n.Content[i+1]
				found = true
				break
			}
		}
		if !found {
			break
		}
	}
	return line
}

// pathAtLine names the field whose value starts on line ("perNode.accelerators"),
// or "" when none does.
func (d doc) pathAtLine(line int) string {
	var walk func(n *yaml.Node, path string) string
	walk = func(n *yaml.Node, path string) string {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				if found := walk(v, p); found != "" {
					return found
				}
				if v.Line == line && (v.Kind == yaml.ScalarNode || v.Line == k.Line) {
					return p
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if found := walk(c, fmt.Sprintf("%s[%d]", path, i)); found != "" {
					return found
				}
			}
		}
		return ""
	}
	return walk(d.root(), "")
}

// located turns "field: message" validation errors (optionally prefixed
// with the job, `job "x": `) into "file:line: field: message".
func (d doc) located(err error) error {
	var lines []string
	for _, msg := range strings.Split(err.Error(), "\n") {
		rest := msg
		if strings.HasPrefix(rest, "job \"") {
			if _, after, ok := strings.Cut(rest, "\": "); ok {
				rest = after
			}
		}
		field, _, ok := strings.Cut(rest, ":")
		line := d.node.Line
		if ok && !strings.Contains(field, " ") {
			line = d.fieldLine(field)
		}
		lines = append(lines, fmt.Sprintf("%s:%d: %s", d.file, line, msg))
	}
	return errors.New(strings.Join(lines, "\n"))
}

// loadJobs reads and validates job specs.
func loadJobs(file string) ([]fleet.JobSpec, error) {
	docs, err := readDocs(file)
	if err != nil {
		return nil, err
	}
	var out []fleet.JobSpec
	for _, d := range docs {
		var j fleet.JobSpec
		if err := d.decode(&j); err != nil {
			return nil, err
		}
		if err := j.Validate(policy.Config{}); err != nil {
			return nil, d.located(err)
		}
		if err := j.Run.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", d.file, d.fieldLine("run"), err)
		}
		out = append(out, j)
	}
	return out, nil
}

// loadTeams reads and validates a teams file: the same format as
// 'simulate --teams' (a "teams:" list, or a bare list of teams); errors
// name the file, line and field. "-" reads standard input.
func loadTeams(file string) ([]policy.Team, error) {
	data, err := readFile(file)
	if err != nil {
		return nil, err
	}
	tf, err := sim.ParseTeams(data, file)
	if err != nil {
		return nil, err
	}
	return tf.Teams, nil
}
