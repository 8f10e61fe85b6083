package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

// stepFiles is the deterministic content of a test checkpoint.
func stepFiles(step, version int) map[string][]byte {
	fill := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*31) ^ seed
		}
		return b
	}
	s := byte(step*7 + version*13)
	return map[string][]byte{
		"model.bin":       fill(256<<10, s),
		"optim/state.bin": fill(64<<10, s+1),
		"meta.json":       []byte(fmt.Sprintf(`{"step":%d,"version":%d}`, step, version)),
	}
}

func sameFiles(t *testing.T, got, want map[string][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d files, want %d", len(got), len(want))
	}
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Fatalf("file %s differs", name)
		}
	}
}

func TestWriteDirRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt", "step-10")
	want := stepFiles(10, 1)
	if err := WriteDir(dir, want); err != nil {
		t.Fatalf("WriteDir: %v", err)
	}
	m, err := Verify(dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if len(m.Files) != 3 || m.Files[0].Name != "meta.json" || m.Files[2].Name != "optim/state.bin" || m.Files[1].Size != 256<<10 {
		t.Fatalf("manifest %+v", m.Files)
	}
	got, err := ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	sameFiles(t, got, want)
	// Nothing is left beside the directory.
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		t.Fatalf("leftovers beside the checkpoint: %v", entries)
	}
	// Writing an existing directory replaces it atomically.
	v2 := stepFiles(10, 2)
	if err := WriteDir(dir, v2); err != nil {
		t.Fatalf("rewrite: %v", err)
	}
	got, err = ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, got, v2)
	if entries, _ := os.ReadDir(filepath.Dir(dir)); len(entries) != 1 {
		t.Fatalf("leftovers after a rewrite: %v", entries)
	}
}

func TestWriteDirRefusesBadInput(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"", "../escape", "/abs", "a/../b", ManifestName, "./x", "."} {
		if err := WriteDir(filepath.Join(root, "c"), map[string][]byte{name: []byte("x")}); err == nil {
			t.Errorf("WriteDir accepted file name %q", name)
		}
	}
	// A callback error or a symlink aborts the write and leaves nothing.
	if err := WriteDirFunc(filepath.Join(root, "c"), func(string) error { return errors.New("disk on fire") }); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("callback error = %v", err)
	}
	if err := WriteDirFunc(filepath.Join(root, "c"), func(tmp string) error { return os.Symlink("/etc/passwd", filepath.Join(tmp, "link")) }); err == nil {
		t.Fatal("a symlink was accepted into a checkpoint")
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("failed writes left %v", entries)
	}
}

func TestVerifyRefusesIncompleteOrCorruptDirectories(t *testing.T) {
	root := t.TempDir()
	write := func(name string) string {
		d := filepath.Join(root, name)
		if err := WriteDir(d, stepFiles(1, 1)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	editManifest := func(d string, edit func(*Manifest)) {
		p := filepath.Join(d, ManifestName)
		var m Manifest
		data, _ := os.ReadFile(p)
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		edit(&m)
		data, _ = json.Marshal(m)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string]func() string{
		"missing directory": func() string { return filepath.Join(root, "nope") },
		"no manifest": func() string {
			d := filepath.Join(root, "bare")
			os.MkdirAll(d, 0o755)
			os.WriteFile(filepath.Join(d, "model.bin"), []byte("x"), 0o644)
			return d
		},
		"flipped byte": func() string {
			d := write("flipped")
			p := filepath.Join(d, "model.bin")
			data, _ := os.ReadFile(p)
			data[1000] ^= 0xff
			os.WriteFile(p, data, 0o644)
			return d
		},
		"truncated file": func() string {
			d := write("truncated")
			os.Truncate(filepath.Join(d, "optim", "state.bin"), 10)
			return d
		},
		"missing file": func() string {
			d := write("missing")
			os.Remove(filepath.Join(d, "meta.json"))
			return d
		},
		"file replaced by symlink": func() string {
			d := write("symlinked")
			p := filepath.Join(d, "meta.json")
			os.Rename(p, p+".real")
			os.Symlink(p+".real", p)
			return d
		},
		"truncated manifest": func() string {
			d := write("halfmanifest")
			os.Truncate(filepath.Join(d, ManifestName), 20)
			return d
		},
		"manifest escaping the directory": func() string {
			d := write("escape")
			editManifest(d, func(m *Manifest) { m.Files[0].Name = "../escape/meta.json" })
			return d
		},
		"manifest with a bad hash": func() string {
			d := write("badhash")
			editManifest(d, func(m *Manifest) { m.Files[0].SHA256 = "zz" })
			return d
		},
		"manifest of another version": func() string {
			d := write("version")
			editManifest(d, func(m *Manifest) { m.Version = 99 })
			return d
		},
		"duplicate entry": func() string {
			d := write("dup")
			editManifest(d, func(m *Manifest) { m.Files = append(m.Files, m.Files[0]) })
			return d
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			d := mk()
			if _, err := Verify(d); err == nil {
				t.Fatal("Verify accepted it")
			}
			if _, err := ReadDir(d); err == nil {
				t.Fatal("ReadDir accepted it")
			}
		})
	}
	if _, err := Verify(filepath.Join(root, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing dir: %v, want fs.ErrNotExist", err)
	}
	if _, err := Verify(filepath.Join(root, "bare")); !errors.Is(err, ErrNoManifest) {
		t.Errorf("bare dir: %v, want ErrNoManifest", err)
	}
}

// helperCrashWriter commits step 1 through the control socket, then writes
// CKPT_TARGET and stops dead (until SIGKILLed) at CKPT_STAGE.
func helperCrashWriter() error {
	root, sock, stage, target := os.Getenv("CKPT_ROOT"), os.Getenv("CKPT_SOCKET"), os.Getenv("CKPT_STAGE"), os.Getenv("CKPT_TARGET")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	step1 := filepath.Join(root, "step-1")
	if err := WriteDir(step1, stepFiles(1, 1)); err != nil {
		return err
	}
	if err := control.SendReport(ctx, sock, control.Report{Type: control.ReportCheckpoint, Step: 1, Path: step1, WorldSize: 1}); err != nil {
		return err
	}
	fmt.Println("committed 1")
	freeze := func(s string) {
		fmt.Println("STAGE " + s)
		time.Sleep(time.Hour) // until the test kills us
	}
	testHook = func(s string) {
		if s == stage {
			freeze(s)
		}
	}
	files := stepFiles(2, 2)
	err := WriteDirFunc(filepath.Join(root, target), func(tmp string) error {
		if err := os.WriteFile(filepath.Join(tmp, "meta.json"), files["meta.json"], 0o644); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(tmp, "model.bin"))
		if err != nil {
			return err
		}
		defer f.Close()
		data := files["model.bin"]
		if _, err := f.Write(data[:len(data)/2]); err != nil {
			return err
		}
		if stage == "mid-file" {
			freeze(stage)
		}
		_, err = f.Write(data[len(data)/2:])
		return err
	})
	if err != nil {
		return err
	}
	fmt.Println("written " + target)
	return nil
}

// A worker SIGKILLed at any point while writing a checkpoint never leaves a
// torn checkpoint that a restart would be handed or that Verify would load.
func TestCrashDuringWriteNeverLeavesTornCheckpoint(t *testing.T) {
	cli := etcdClient(t)
	cases := []struct{ target, stage string }{
		{"step-2", "mid-file"},
		{"step-2", "files-synced"},
		{"step-2", "manifest-written"},
		{"step-2", "renamed"}, // complete on disk, never reported
		{"step-1", "mid-file"},
		{"step-1", "manifest-written"}, // replacing the committed dir
	}
	for i, tc := range cases {
		t.Run(tc.target+"/"+tc.stage, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			root := t.TempDir()
			store := NewStore(cli, "", uniqueJob(fmt.Sprintf("job-crash-%d", i)))
			ch, err := control.NewChannel(filepath.Join(root, "ctl"), control.WithHandler(store.ReportHandler(nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			ckpts := filepath.Join(root, "ckpt")
			cmd, out := startHelper(t, "crash-writer", "CKPT_ROOT="+ckpts, "CKPT_SOCKET="+ch.SocketPath(), "CKPT_STAGE="+tc.stage, "CKPT_TARGET="+tc.target)
			out.waitFor(t, 20*time.Second, "step 1 commit", func(l string) bool { return l == "committed 1" })
			out.waitFor(t, 20*time.Second, "stage "+tc.stage, func(l string) bool { return l == "STAGE "+tc.stage })
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()

			// What a restart would be handed: the last committed checkpoint.
			rec, err := store.Latest(ctx)
			if err != nil || rec == nil {
				t.Fatalf("Latest: %+v, %v", rec, err)
			}
			if rec.Step != 1 || rec.Path != filepath.Join(ckpts, "step-1") {
				t.Fatalf("a restart would get %+v, want the committed step 1", rec)
			}
			got, err := ReadDir(rec.Path)
			if err != nil {
				t.Fatalf("committed checkpoint no longer loads: %v", err)
			}
			sameFiles(t, got, stepFiles(1, 1))

			step2 := filepath.Join(ckpts, "step-2")
			_, err = Verify(step2)
			switch {
			case tc.target == "step-2" && tc.stage == "renamed":
				if err != nil {
					t.Fatalf("fully written step-2 does not verify: %v", err)
				}
			case !errors.Is(err, fs.ErrNotExist):
				t.Fatalf("step-2 after a crash: Verify = %v, want not-exist", err)
			}
			// Leftover temporary directories are never valid checkpoints
			// before their manifest is written.
			tmps, _ := filepath.Glob(filepath.Join(ckpts, ".step-*.tmp-*"))
			if tc.stage == "mid-file" || tc.stage == "files-synced" {
				if len(tmps) != 1 {
					t.Fatalf("expected the dead writer's temp dir, found %v", tmps)
				}
				if _, err := Verify(tmps[0]); !errors.Is(err, ErrNoManifest) {
					t.Fatalf("temp dir of a dead writer: Verify = %v, want ErrNoManifest", err)
				}
			}
		})
	}
}

// helperLoopWriter writes and reports steps 1, 2, 3, ... until killed.
func helperLoopWriter() error {
	root, sock := os.Getenv("CKPT_ROOT"), os.Getenv("CKPT_SOCKET")
	for step := 1; ; step++ {
		dir := filepath.Join(root, fmt.Sprintf("step-%d", step))
		if err := WriteDir(dir, stepFiles(step, 1)); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := control.SendReport(ctx, sock, control.Report{Type: control.ReportCheckpoint, Step: int64(step), Path: dir, WorldSize: 1})
		cancel()
		if err != nil {
			return err
		}
		fmt.Printf("committed %d\n", step)
	}
}

// The same, with the kill at an arbitrary moment of a writer that keeps
// checkpointing: the recorded checkpoint always loads, and every step
// directory is either complete or absent.
func TestKillAtRandomMomentKeepsLatestLoadable(t *testing.T) {
	cli := etcdClient(t)
	for round := 0; round < 3; round++ {
		ctx := testCtx(t, 30*time.Second)
		root := t.TempDir()
		store := NewStore(cli, "", uniqueJob(fmt.Sprintf("job-loop-%d", round)))
		ch, err := control.NewChannel(filepath.Join(root, "ctl"), control.WithHandler(store.ReportHandler(nil)))
		if err != nil {
			t.Fatal(err)
		}
		ckpts := filepath.Join(root, "ckpt")
		cmd, out := startHelper(t, "loop-writer", "CKPT_ROOT="+ckpts, "CKPT_SOCKET="+ch.SocketPath())
		out.waitFor(t, 20*time.Second, "two commits", func(l string) bool { return l == "committed 2" })
		time.Sleep(time.Duration(rand.Intn(40)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		ch.Close()

		rec, err := store.Latest(ctx)
		if err != nil || rec == nil || rec.Step < 2 {
			t.Fatalf("Latest = %+v, %v", rec, err)
		}
		got, err := ReadDir(rec.Path)
		if err != nil {
			t.Fatalf("recorded checkpoint %s does not load: %v", rec.Path, err)
		}
		sameFiles(t, got, stepFiles(int(rec.Step), 1))
		entries, _ := os.ReadDir(ckpts)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), "step-") {
				continue // a dead writer's temp dir
			}
			n, _ := strconv.Atoi(strings.TrimPrefix(e.Name(), "step-"))
			got, err := ReadDir(filepath.Join(ckpts, e.Name()))
			if err != nil {
				t.Fatalf("%s exists but is torn: %v", e.Name(), err)
			}
			sameFiles(t, got, stepFiles(n, 1))
			if int64(n) > rec.Step+1 {
				t.Fatalf("%s written but record at %d", e.Name(), rec.Step)
			}
		}
	}
}
