package api

import (
	"path/filepath"
	"strings"
)

// dangerousRoots are host paths no job may bind-mount, nor any directory
// holding one: the kernel's and the devices' interfaces, the runtimes'
// sockets and state (containerd's socket is control of the node), the
// host's configuration and credentials, and root's home.
var dangerousRoots = []struct{ path, why string }{
	{"/proc", "the kernel's process interface"},
	{"/sys", "the kernel's sysfs"},
	{"/dev", "the host's device nodes"},
	{"/run", "the host's runtime sockets (containerd, systemd, the agent's run directories)"},
	{"/var/run", "the host's runtime sockets (containerd, systemd, the agent's run directories)"},
	{"/var/lib/containerd", "containerd's state (every container's filesystem)"},
	{"/var/lib/docker", "docker's state"},
	{"/var/lib/kubelet", "the kubelet's state (every pod's secrets)"},
	{"/etc", "the host's configuration and credentials"},
	{"/boot", "the host's kernel and boot loader"},
	{"/root", "root's home directory"},
}

// DangerousMountSource says why a job may never bind-mount the host path
// source, whatever a node allows ("" when nothing is known against it). It
// looks at the path alone (no file system access), so elasticctl and the
// coordinator refuse such a spec at submit and a node agent again before
// it creates a container: a relative path or one with "..", "/", and any
// path under or holding /proc, /sys, /dev, /run, /var/run,
// /var/lib/{containerd,docker,kubelet}, /etc, /boot or /root (containerd's
// socket lives under /run).
func DangerousMountSource(source string) string {
	if source == "" {
		return "an empty mount source"
	}
	if !filepath.IsAbs(source) {
		return "a relative mount source (mount sources are absolute host paths)"
	}
	for _, el := range strings.Split(source, "/") {
		if el == ".." {
			return `a mount source with ".." in it`
		}
	}
	p := filepath.Clean(source)
	if p == "/" {
		return "the host's root file system"
	}
	for _, d := range dangerousRoots {
		switch {
		case Within(p, d.path):
			return d.why
		case Within(d.path, p):
			return "a directory holding " + d.path + " (" + d.why + ")"
		}
	}
	return ""
}

// Within reports whether the clean absolute path p is dir or under it,
// path element by path element (/data2 is not within /data).
func Within(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}
