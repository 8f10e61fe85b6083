package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
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

// loadedJob is a job read from a file, with where it was defined.
type loadedJob struct {
	spec     fleet.JobSpec
	file     string
	line     int // the document's first line
	nameLine int
	teamLine int
}

// maxFileErrors bounds the errors reported for one file.
const maxFileErrors = 20

// loadJobFile reads and checks a job file ("-" is standard input).
func loadJobFile(file string) ([]loadedJob, error) {
	data, err := readFile(file)
	if err != nil {
		return nil, err
	}
	return parseJobs(data, file)
}

// loadJobs reads and validates job specs.
func loadJobs(file string) ([]fleet.JobSpec, error) {
	loaded, err := loadJobFile(file)
	if err != nil {
		return nil, err
	}
	out := make([]fleet.JobSpec, len(loaded))
	for i, j := range loaded {
		out[i] = j.spec
	}
	return out, nil
}

// parseJobs decodes and validates every document of a job file in one
// pass (two decoders over the same bytes in step: one for the node tree
// that locates fields, one strict into the job), and reports every
// problem of the whole file, each with its file, line and field path.
func parseJobs(data []byte, file string) ([]loadedJob, error) {
	nodes := yaml.NewDecoder(bytes.NewReader(data))
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	var out []loadedJob
	var errs []string
	defined := map[string]int{}
	for idx := 0; ; idx++ {
		var n yaml.Node
		err := nodes.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %s", file, yamlMessage(strings.TrimPrefix(err.Error(), "yaml: "))))
			break
		}
		var j fleet.JobSpec
		serr := strict.Decode(&j)
		if len(n.Content) == 0 {
			continue
		}
		d := doc{file, data, idx, &n}
		if d.root().Kind != yaml.MappingNode {
			errs = append(errs, fmt.Sprintf("%s:%d: a job must be a mapping (name, team, perNode, run, ...), not %s", file, d.root().Line, nodeKind(d.root())))
			continue
		}
		if serr != nil {
			errs = append(errs, d.typeErrors(serr)...)
			continue
		}
		if err := j.Validate(policy.Config{}); err != nil {
			errs = append(errs, d.located(err).Error())
			continue
		}
		if err := j.Run.Validate(); err != nil {
			errs = append(errs, fmt.Sprintf("%s:%d: %v", file, d.fieldLine(strings.SplitN(err.Error(), ":", 2)[0]), err))
			continue
		}
		lj := loadedJob{spec: j, file: file, line: d.root().Line, nameLine: d.fieldLine("name"), teamLine: d.fieldLine("team")}
		if first, dup := defined[j.Name]; dup {
			errs = append(errs, fmt.Sprintf("%s:%d: name: job %q is defined twice (first at line %d): names must be unique", file, lj.nameLine, j.Name, first))
			continue
		}
		defined[j.Name] = lj.nameLine
		out = append(out, lj)
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(capLines(errs, maxFileErrors), "\n"))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no job found: want one job per YAML document (see examples/job.yaml)", file)
	}
	return out, nil
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "this"
}

// typeErrors words the strict decoder's errors with the file, line and
// field path, in YAML terms.
func (d doc) typeErrors(err error) []string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []string{fmt.Sprintf("%s: %s", d.file, yamlMessage(strings.TrimPrefix(err.Error(), "yaml: ")))}
	}
	var msgs []string
	for _, e := range te.Errors {
		// "line 4: cannot unmarshal ..." -> "f.yaml:4: perNode.accelerators: want ..."
		rest := strings.TrimPrefix(e, "line ")
		if num, msg, ok := strings.Cut(rest, ": "); ok {
			msg = yamlMessage(msg)
			rest = num + ": " + msg
			if line, err := strconv.Atoi(num); err == nil {
				if path := d.pathAtLine(line); path != "" && !strings.HasPrefix(msg, "unknown field") {
					rest = num + ": " + path + ": " + msg
				}
			}
		}
		msgs = append(msgs, d.file+":"+rest)
	}
	return msgs
}

var (
	unmarshalRE = regexp.MustCompile("cannot unmarshal !*(\\S*?)(?: `([^`]*)`)? into (\\S+)")
	lineRE      = regexp.MustCompile(`^\s*line (\d+): (.*)$`)
	unknownRE   = regexp.MustCompile(`field (.*?) not found in type \S+`)
)

// typeWords says in YAML terms what a Go type of the job and team files
// wants.
var typeWords = map[string]string{
	"int": "a whole number", "int64": "a whole number", "*int": "a whole number", "uint64": "a whole number",
	"float64": "a number", "bool": "true or false", "string": "a string",
	"[]int": "a list of whole numbers", "[]string": "a list of strings",
	"map[string]string": "a mapping of names to strings", "map[string]int": "a mapping of names to whole numbers",
	"time.Time": "a time such as 2026-01-02T15:04:05Z", "time.Duration": "a duration such as 60s",
	"api.Resources":        "a mapping with accelerators, vcpus and memory",
	"policy.Resources":     "a mapping with accelerators, vcpus and memory",
	"fleet.RunSpec":        "a mapping with script, args, env, ...",
	"fleet.JobSpec":        "a job: a mapping with name, team, perNode, run, ...",
	"api.Team":             "a team: a mapping with name, quotas, ...",
	"policy.Team":          "a team: a mapping with name, quotas, ...",
	"[]api.FlavorQuota":    "a list of quotas (flavor, nominal, ...)",
	"[]policy.FlavorQuota": "a list of quotas (flavor, nominal, ...)",
	"api.FlavorQuota":      "a quota: a mapping with flavor, nominal, ...",
	"api.ByteSize":         "a size such as 64Gi or 512Mi",
	"policy.ByteSize":      "a size such as 64Gi or 512Mi",
	"api.PreemptionPolicy": "Never or LowerPriority",
	"[]api.Team":           "a list of teams", "[]policy.Team": "a list of teams",
	"sim.TeamsFile": "a mapping with teams (and fleet, config)",
}

var tagWords = map[string]string{"int": "a number", "float": "a number", "str": "a string", "bool": "a boolean",
	"map": "a mapping", "seq": "a list", "null": "nothing", "timestamp": "a time"}

// knownFields are the fields of the job and team files, for did-you-mean.
var knownFields = []string{"name", "team", "priority", "priorityClass", "flavor", "perNode", "accelerators", "vcpus", "memory",
	"minNodes", "maxNodes", "step", "sizes", "elastic", "suspended", "submitTime", "run", "script", "args", "module", "noPython",
	"nprocPerNode", "python", "env", "maxRestarts", "gracefulTimeoutSeconds", "workDir",
	"cohort", "weight", "preemption", "quotas", "nominal", "borrowingLimit", "lendingLimit", "teams", "fleet", "config",
	"current-context", "contexts", "endpoints", "prefix", "cacert", "cert", "key", "user", "passwordFile"}

// yamlMessage rewrites the YAML library's messages, which name Go types
// ("cannot unmarshal !!int `3` into api.Resources"), in the file's terms.
func yamlMessage(msg string) string {
	if m := unknownRE.FindStringSubmatch(msg); m != nil {
		out := fmt.Sprintf("unknown field %q", m[1])
		if s := closest(m[1], knownFields); s != "" {
			out += fmt.Sprintf(": did you mean %q?", s)
		}
		return out
	}
	if m := unmarshalRE.FindStringSubmatch(msg); m != nil {
		want, ok := typeWords[m[3]]
		if !ok {
			switch {
			case strings.HasPrefix(m[3], "[]"):
				want = "a list"
			case strings.HasPrefix(m[3], "map["):
				want = "a mapping"
			case strings.Contains(m[3], "."):
				want = "a value of another kind"
			default:
				want = "a " + m[3]
			}
		}
		got := tagWords[m[1]]
		if got == "" {
			got = "a value"
		}
		val := m[2]
		if len(val) > 40 {
			val = val[:40] + "..."
		}
		if val == "" {
			return fmt.Sprintf("want %s, got %s", want, got)
		}
		return fmt.Sprintf("want %s, got %s (%s)", want, got, val)
	}
	return msg
}

// isTeamsFile tells a teams file (a "teams:" list, or a bare list) from
// a file of jobs.
func isTeamsFile(data []byte) bool {
	var n yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&n); err != nil || len(n.Content) == 0 {
		return false
	}
	root := n.Content[0]
	if root.Kind == yaml.SequenceNode {
		return true
	}
	if root.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == "teams" {
				return true
			}
		}
	}
	return false
}

// parseTeams reads and validates a teams file: the same format as
// 'simulate --teams'; errors name the file, line and field.
func parseTeams(data []byte, file string) ([]policy.Team, error) {
	tf, err := sim.ParseTeams(data, file)
	if err != nil {
		// The YAML library's "file: unmarshal errors:\n  line 5: ..." becomes
		// "file:5: teams[0].quotas[0].nominal: ...".
		var d *doc
		var n yaml.Node
		if yaml.Unmarshal(data, &n) == nil && len(n.Content) > 0 {
			d = &doc{file: file, data: data, node: &n}
		}
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			if strings.HasSuffix(l, ": unmarshal errors:") {
				continue
			}
			if m := lineRE.FindStringSubmatch(l); m != nil {
				msg := rewriteTypeMessages(m[2])
				if num, _ := strconv.Atoi(m[1]); d != nil && !strings.HasPrefix(msg, "unknown field") {
					if path := d.pathAtLine(num); path != "" {
						msg = path + ": " + msg
					}
				}
				l = fmt.Sprintf("%s:%s: %s", file, m[1], msg)
			}
			lines = append(lines, rewriteTypeMessages(l))
		}
		return nil, errors.New(strings.Join(lines, "\n"))
	}
	return tf.Teams, nil
}

// rewriteTypeMessages applies yamlMessage to the part of a line after its
// "file:line: " location.
func rewriteTypeMessages(line string) string {
	if m := unmarshalRE.FindStringIndex(line); m != nil {
		return line[:m[0]] + yamlMessage(line[m[0]:])
	}
	if m := unknownRE.FindStringIndex(line); m != nil {
		return line[:m[0]] + yamlMessage(line[m[0]:])
	}
	return line
}

// loadTeams reads and validates a teams file ("-" is standard input).
func loadTeams(file string) ([]policy.Team, error) {
	data, err := readFile(file)
	if err != nil {
		return nil, err
	}
	return parseTeams(data, file)
}
