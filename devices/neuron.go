package devices

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/hyperpodrun/hyperpodrun/devices/local"
)

// DefaultNeuronSysfsRoot is where the Neuron driver publishes one directory
// per device.
//
// The layout read here is the aws-neuron-driver's (neuron_cdev.c and
// neuron_sysfs_metrics.c; the Neuron Sysfs User Guide documents it):
//
//	neuron<N>/core_count                         "%d", physical NeuronCores (no newline)
//	neuron<N>/connected_devices                  "1, 3, 4, 12\n" or "\n" (driver >= 2.13)
//	neuron<N>/info/architecture/device_name      "Inferentia", "Trainium1", "Inferentia2", "Trainium2", ...
//	neuron<N>/info/architecture/arch_type        "NDv2", ... (optional)
//	neuron<N>/info/serial_number                 "%016llx\n" or "\n" (optional)
//	neuron<N>/stats/hardware/mem_ecc_uncorrected  "%u\n", HBM uncorrected ECC events (driver >= 2.14)
//	neuron<N>/stats/hardware/sram_ecc_uncorrected "%u\n", SRAM uncorrected ECC events (driver >= 2.14)
//
// and the character device /dev/neuron<N>. core_count is mode 0400: the
// agent must run as root to read it.
const DefaultNeuronSysfsRoot = "/sys/devices/virtual/neuron_device"

// maxSysfsFile bounds what is read from one sysfs attribute (a page).
const maxSysfsFile = 4096

// maxNeuronCores bounds a sane core_count (trn2 has 8 per device).
const maxNeuronCores = 128

// neuronLNCEnv selects the logical NeuronCore size (1 or 2) for the Neuron
// runtime; trn2 and later default to 2.
const neuronLNCEnv = "NEURON_LOGICAL_NC_CONFIG"

var neuronDirRE = regexp.MustCompile(`^neuron(\d+)$`)

// discoverNeuron reads every neuron<N> directory under root. A missing root
// is the normal no-driver case (a reason, no error). A malformed device gives
// an error naming the file; the device is then listed unhealthy when its
// name is known, and left out when it is not.
func discoverNeuron(ctx context.Context, root, devRoot string, getenv func(string) string) ([]Accelerator, []string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, []string{fmt.Sprintf("neuron: no Neuron driver (%s does not exist)", root)}, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("neuron: %w", fileErr(root, "read: ", err))
	}
	type dev struct {
		index int
		dir   string
	}
	var devs []dev
	for _, e := range entries {
		m := neuronDirRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		idx, err := strconv.Atoi(m[1])
		if err != nil || idx > 1<<16 {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		devs = append(devs, dev{idx, dir})
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].index < devs[j].index })
	if len(devs) == 0 {
		return nil, []string{fmt.Sprintf("neuron: driver present but no neuron<N> devices under %s", root)}, nil
	}

	var (
		accs    []Accelerator
		reasons []string
		errs    []error
	)
	lncEnv := strings.TrimSpace(getenv(neuronLNCEnv))
	lnc := 0
	switch lncEnv {
	case "":
	case "1", "2":
		lnc, _ = strconv.Atoi(lncEnv)
	default:
		reasons = append(reasons, fmt.Sprintf("neuron: ignoring %s=%q (want 1 or 2)", neuronLNCEnv, lncEnv))
	}
	for _, d := range devs {
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("neuron: %w", err)
		}
		acc, known, err := readNeuronDevice(d.index, d.dir, devRoot, lnc)
		if err != nil {
			errs = append(errs, err)
		}
		if known {
			accs = append(accs, acc)
			if !acc.Healthy {
				reasons = append(reasons, fmt.Sprintf("neuron%d unhealthy: %s", acc.Index, acc.HealthReason))
			}
		}
	}
	return accs, reasons, errors.Join(errs...)
}

// readNeuronDevice reads one device directory. known is false when not even
// its name could be read.
func readNeuronDevice(index int, dir, devRoot string, lnc int) (acc Accelerator, known bool, err error) {
	nameFile := filepath.Join(dir, "info", "architecture", "device_name")
	name, present, err := readSysfs(nameFile)
	if err != nil {
		return acc, false, err
	}
	if !present {
		return acc, false, fmt.Errorf("neuron%d: %s: missing (partial sysfs tree?)", index, nameFile)
	}
	if name == "" || !printable(name) {
		return acc, false, fmt.Errorf("neuron%d: %s: invalid device name %q", index, nameFile, name)
	}
	acc = Accelerator{
		Kind:       KindNeuron,
		Index:      index,
		Name:       name,
		Flavor:     NeuronFlavor(name),
		Minor:      index,
		DevicePath: fmt.Sprintf("/dev/neuron%d", index),
		Healthy:    true,
	}
	var problems []string
	fail := func(e error) {
		problems = append(problems, e.Error())
		err = errors.Join(err, fmt.Errorf("neuron%d: %w", index, e))
	}

	coreFile := filepath.Join(dir, "core_count")
	switch s, ok, e := readSysfs(coreFile); {
	case e != nil:
		fail(e)
	case !ok:
		fail(fmt.Errorf("%s: missing (partial sysfs tree?)", coreFile))
	default:
		n, e := strconv.Atoi(s)
		if e != nil || n <= 0 || n > maxNeuronCores {
			fail(fmt.Errorf("%s: invalid core count %q (want 1-%d)", coreFile, s, maxNeuronCores))
		} else {
			acc.Cores = n
			acc.LogicalCores = local.LogicalCores(n, name, lnc)
		}
	}

	connFile := filepath.Join(dir, "connected_devices")
	if s, ok, e := readSysfs(connFile); e != nil {
		fail(e)
	} else if ok {
		ids, e := parseConnected(s)
		if e != nil {
			fail(fmt.Errorf("%s: %w", connFile, e))
		}
		acc.ConnectedDevices = ids
	}

	if s, ok, e := readSysfs(filepath.Join(dir, "info", "architecture", "arch_type")); e == nil && ok && printable(s) {
		acc.Arch = s
	}
	if s, ok, e := readSysfs(filepath.Join(dir, "info", "serial_number")); e == nil && ok && printable(s) {
		acc.UUID = s
	}

	var ecc []string
	for _, c := range []struct{ file, what string }{
		{"mem_ecc_uncorrected", "HBM"},
		{"sram_ecc_uncorrected", "SRAM"},
	} {
		n, ok, e := readCounter(filepath.Join(dir, "stats", "hardware", c.file))
		if e != nil {
			fail(e)
			continue
		}
		if ok && n > 0 {
			ecc = append(ecc, fmt.Sprintf("%d uncorrected %s ECC errors", n, c.what))
		}
	}

	node := filepath.Join(devRoot, fmt.Sprintf("neuron%d", index))
	if _, e := os.Stat(node); e != nil {
		problems = append(problems, "device node "+fileErr(node, "", e).Error())
	}

	problems = append(problems, ecc...)
	if len(problems) > 0 {
		acc.Healthy = false
		acc.HealthReason = strings.Join(problems, "; ")
	}
	return acc, true, err
}

// parseConnected parses "1, 3, 4, 12" (possibly empty).
func parseConnected(s string) ([]int, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > 1<<16 {
			return nil, fmt.Errorf("invalid device id %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// readCounter reads a numeric sysfs attribute. The driver publishes the ECC
// counters as plain files; a counter directory (total/present, the layout of
// most Neuron metrics) is read through its total.
func readCounter(path string) (uint64, bool, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "total")
	}
	s, ok, err := readSysfs(path)
	if err != nil || !ok {
		return 0, ok, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("%s: invalid counter %q", path, s)
	}
	return n, true, nil
}

// readSysfs reads a small attribute file, trimmed. present is false when it
// does not exist.
func readSysfs(path string) (value string, present bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fileErr(path, "", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSysfsFile+1))
	if err != nil {
		return "", true, fileErr(path, "read: ", err)
	}
	if len(b) > maxSysfsFile {
		return "", true, fmt.Errorf("%s: larger than %d bytes, not a sysfs attribute", path, maxSysfsFile)
	}
	return strings.TrimSpace(string(b)), true, nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// fileErr names the file once: "path: op: errno".
func fileErr(path, op string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s: %s%w", path, op, err)
}
