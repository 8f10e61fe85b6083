package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// FleetSpec describes identical nodes of one flavor.
type FleetSpec struct {
	Flavor              string          `json:"flavor" yaml:"flavor"`
	Nodes               int             `json:"nodes" yaml:"nodes"`
	AcceleratorsPerNode int             `json:"acceleratorsPerNode" yaml:"acceleratorsPerNode"`
	VCPUs               int             `json:"vcpus,omitempty" yaml:"vcpus,omitempty"`
	Memory              policy.ByteSize `json:"memory,omitempty" yaml:"memory,omitempty"`
}

// TeamsFile is the teams YAML: the same team specs `elasticctl apply`
// takes, plus an optional fleet for `elasticctl simulate`.
//
//	teams:
//	- name: research
//	  cohort: lab            # optional; teams without one share the default cohort
//	  weight: 2              # fair-share weight, default 1
//	  preemption: LowerPriority   # or Never (default)
//	  quotas:
//	  - flavor: nvidia-h100-80gb
//	    nominal: 128         # guaranteed accelerators
//	    borrowingLimit: 64   # optional; omit for unlimited
//	    lendingLimit: 96     # optional; omit to lend all idle quota
//	fleet:                   # optional (simulate only)
//	- flavor: nvidia-h100-80gb
//	  nodes: 32
//	  acceleratorsPerNode: 8
//	config:                  # optional engine settings
//	  minStablePeriod: 60s
//
// A bare YAML list of teams is accepted too.
type TeamsFile struct {
	Teams  []policy.Team  `json:"teams" yaml:"teams"`
	Fleet  []FleetSpec    `json:"fleet,omitempty" yaml:"fleet,omitempty"`
	Config *policy.Config `json:"config,omitempty" yaml:"config,omitempty"`
}

// LoadTeams reads and validates a teams file.
func LoadTeams(path string) (*TeamsFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseTeams(data, path)
}

// ParseTeams parses and validates a teams file; errors carry the file name,
// the line and the field ("teams.yaml:12: team \"a\": quotas[0].nominal: ...").
func ParseTeams(data []byte, name string) (*TeamsFile, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%s: empty file; want a teams: list", name)
	}
	doc := root.Content[0]
	var tf TeamsFile
	var teamNodes []*yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var err error
	switch doc.Kind {
	case yaml.SequenceNode:
		teamNodes = doc.Content
		err = dec.Decode(&tf.Teams)
	case yaml.MappingNode:
		for i := 0; i+1 < len(doc.Content); i += 2 {
			if k := doc.Content[i]; k.Value == "teams" {
				teamNodes = doc.Content[i+1].Content
			}
		}
		err = dec.Decode(&tf)
	default:
		return nil, fmt.Errorf("%s:%d: want a mapping with teams: or a list of teams", name, doc.Line)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	seen := map[string]int{}
	for i, t := range tf.Teams {
		line := 0
		if i < len(teamNodes) {
			line = teamNodes[i].Line
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		if l, dup := seen[t.Name]; dup {
			return nil, fmt.Errorf("%s:%d: team %q already defined at line %d", name, line, t.Name, l)
		}
		seen[t.Name] = line
	}
	if len(tf.Teams) == 0 {
		return nil, fmt.Errorf("%s: no teams", name)
	}
	for i, f := range tf.Fleet {
		if f.Flavor == "" || f.Nodes < 0 || f.AcceleratorsPerNode < 1 {
			return nil, fmt.Errorf("%s: fleet[%d]: want flavor, nodes >= 0 and acceleratorsPerNode >= 1", name, i)
		}
	}
	return &tf, nil
}

// BuildFleet turns fleet specs into nodes named <flavor>-<i>.
func BuildFleet(specs []FleetSpec) []policy.Node {
	var out []policy.Node
	for _, f := range specs {
		for i := 0; i < f.Nodes; i++ {
			out = append(out, policy.Node{Name: fmt.Sprintf("%s-%04d", f.Flavor, i), Flavor: f.Flavor,
				Accelerators: f.AcceleratorsPerNode, VCPUs: f.VCPUs, Memory: f.Memory})
		}
	}
	return out
}

// DefaultFleet covers the teams' nominal quotas with 8-accelerator nodes,
// per flavor.
func DefaultFleet(teams []policy.Team) []FleetSpec {
	sum := map[string]int{}
	for _, t := range teams {
		for _, q := range t.Quotas {
			sum[q.Flavor] += q.Nominal
		}
	}
	var names []string
	for f := range sum {
		names = append(names, f)
	}
	sort.Strings(names)
	var out []FleetSpec
	for _, f := range names {
		out = append(out, FleetSpec{Flavor: f, Nodes: (sum[f] + 7) / 8, AcceleratorsPerNode: 8})
	}
	return out
}
