package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fsutil"
	"golang.org/x/sys/unix"
)

// ManifestName is the manifest file of a checkpoint directory. It is written
// last; a directory without a valid one is not a checkpoint.
const ManifestName = "hyperpodrun-manifest.json"

// manifestVersion is the only manifest layout this package reads.
const manifestVersion = 1

// ErrNoManifest is returned by Verify and ReadDir for a directory that has
// no manifest (for example one whose writer died).
var ErrNoManifest = errors.New("checkpoint: directory has no manifest")

// Manifest lists the files of a checkpoint directory.
type Manifest struct {
	Version int            `json:"version"`
	Created time.Time      `json:"created"`
	Files   []ManifestFile `json:"files"`
}

// ManifestFile is one file of a checkpoint directory.
type ManifestFile struct {
	// Name is the slash-separated path relative to the directory.
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// testHook, when set by tests, is called at each stage of WriteDirFunc:
// "files-synced", "manifest-written", "renamed".
var testHook func(stage string)

func hook(stage string) {
	if testHook != nil {
		testHook(stage)
	}
}

// checkName validates a manifest or WriteDir file name.
func checkName(name string) error {
	switch {
	case name == "" || !fs.ValidPath(name) || name == ".":
		return fmt.Errorf("invalid file name %q: want a clean relative slash-separated path", name)
	case name == ManifestName:
		return fmt.Errorf("file name %q is reserved for the manifest", name)
	}
	return nil
}

// WriteDir atomically creates the checkpoint directory dir holding files
// (slash-separated relative names, subdirectories allowed). See WriteDirFunc.
func WriteDir(dir string, files map[string][]byte) error {
	for name := range files {
		if err := checkName(name); err != nil {
			return fmt.Errorf("checkpoint: write %s: %w", dir, err)
		}
	}
	return WriteDirFunc(dir, func(tmp string) error {
		for name, data := range files {
			p := filepath.Join(tmp, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// WriteDirFunc atomically creates the checkpoint directory dir: write fills a
// new temporary directory beside dir (regular files and subdirectories only);
// then every file and directory is fsynced, the manifest (names, sizes,
// SHA-256) is written last, the temporary directory is renamed to dir and
// the parent directory is fsynced. An existing dir is replaced atomically
// (Linux renameat2 RENAME_EXCHANGE). If the process dies midway, dir is
// either absent or the previous complete version; a leftover
// ".<name>.tmp-*" directory beside it is never a checkpoint anyone points to.
func WriteDirFunc(dir string, write func(tmp string) error) (err error) {
	dir = filepath.Clean(dir)
	parent, base := filepath.Dir(dir), filepath.Base(dir)
	if base == "." || base == string(filepath.Separator) || base == ".." {
		return fmt.Errorf("checkpoint: write %q: not a directory name", dir)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	if err := write(tmp); err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	m, err := syncTree(tmp)
	if err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	hook("files-synced")
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: write %s: encode manifest: %w", dir, err)
	}
	// writeFileAtomic also fsyncs tmp, making every entry in it durable.
	if err := fsutil.WriteFileAtomic(filepath.Join(tmp, ManifestName), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("checkpoint: write %s: manifest: %w", dir, err)
	}
	hook("manifest-written")
	if err := renameInto(tmp, dir); err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	if err := fsutil.SyncDir(parent); err != nil {
		return fmt.Errorf("checkpoint: write %s: %w", dir, err)
	}
	hook("renamed")
	return nil
}

// syncTree fsyncs every file and subdirectory under root (root itself is
// synced later, with the manifest) and returns the manifest of its files.
func syncTree(root string) (*Manifest, error) {
	m := &Manifest{Version: manifestVersion, Created: time.Now().UTC(), Files: []ManifestFile{}}
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			if p != root {
				dirs = append(dirs, p)
			}
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s: not a regular file or directory", name)
		case name == ManifestName:
			return fmt.Errorf("file name %q is reserved for the manifest", name)
		}
		size, sum, err := hashFile(p, true)
		if err != nil {
			return err
		}
		m.Files = append(m.Files, ManifestFile{Name: name, Size: size, SHA256: sum})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Deepest first, so that a directory is synced after its children.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := fsutil.SyncDir(dirs[i]); err != nil {
			return nil, err
		}
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	return m, nil
}

// hashFile returns the size and SHA-256 of a file, fsyncing it if asked.
func hashFile(p string, sync bool) (int64, string, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", p, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return 0, "", fmt.Errorf("fsync %s: %w", p, err)
		}
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// renameInto renames directory tmp to dir, atomically exchanging it with an
// existing dir and removing the old one.
func renameInto(tmp, dir string) error {
	err := os.Rename(tmp, dir)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("rename into place: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("replace existing %s: %w", dir, err)
	}
	// tmp now holds the previous version.
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("remove previous version of %s: %w", dir, err)
	}
	return nil
}

// loadManifest reads and validates dir's manifest.
func loadManifest(dir string) (*Manifest, error) {
	mp := filepath.Join(dir, ManifestName)
	data, err := os.ReadFile(mp)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return nil, fmt.Errorf("checkpoint: %w", serr)
		}
		return nil, fmt.Errorf("%w: %s", ErrNoManifest, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("checkpoint: malformed manifest %s: %w", mp, err)
	}
	if m.Version != manifestVersion {
		return nil, fmt.Errorf("checkpoint: manifest %s: unsupported version %d", mp, m.Version)
	}
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if err := checkName(f.Name); err != nil {
			return nil, fmt.Errorf("checkpoint: manifest %s: %w", mp, err)
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("checkpoint: manifest %s: %q listed twice", mp, f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 {
			return nil, fmt.Errorf("checkpoint: manifest %s: %q has negative size", mp, f.Name)
		}
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("checkpoint: manifest %s: %q has a malformed sha256", mp, f.Name)
		}
	}
	return &m, nil
}

// checkRegular refuses a manifest entry that is not a regular file (a
// symlink could point anywhere).
func checkRegular(dir, name string) (string, error) {
	p := filepath.Join(dir, filepath.FromSlash(name))
	fi, err := os.Lstat(p)
	if err != nil {
		return "", fmt.Errorf("checkpoint: %s: %w", dir, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("checkpoint: %s: %s is not a regular file", dir, name)
	}
	return p, nil
}

// Verify checks that dir is a complete checkpoint: its manifest is valid and
// every file it lists has the listed size and SHA-256. Files not listed are
// ignored. A missing dir gives an error wrapping fs.ErrNotExist; a dir
// without a manifest, ErrNoManifest.
func Verify(dir string) (*Manifest, error) {
	m, err := loadManifest(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		p, err := checkRegular(dir, f.Name)
		if err != nil {
			return nil, err
		}
		size, sum, err := hashFile(p, false)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %s: %w", dir, err)
		}
		if size != f.Size || sum != f.SHA256 {
			return nil, fmt.Errorf("checkpoint: %s: %s does not match the manifest (size %d, want %d)", dir, f.Name, size, f.Size)
		}
	}
	return m, nil
}

// ReadDir verifies dir like Verify and returns the contents of the files the
// manifest lists, keyed by their slash-separated names.
func ReadDir(dir string) (map[string][]byte, error) {
	m, err := loadManifest(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(m.Files))
	for _, f := range m.Files {
		p, err := checkRegular(dir, f.Name)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %s: %w", dir, err)
		}
		sum := sha256.Sum256(data)
		if int64(len(data)) != f.Size || hex.EncodeToString(sum[:]) != f.SHA256 {
			return nil, fmt.Errorf("checkpoint: %s: %s does not match the manifest", dir, path.Clean(f.Name))
		}
		out[f.Name] = data
	}
	return out, nil
}
