#!/usr/bin/env bash
# Builds a real kube-apiserver from k8s.io/kubernetes at a pinned release
# through the Go module proxy, and caches it outside the repository.
# Prints the binary's path. Usage: scripts/kube-apiserver.sh [version]
# KUBE_CMD=kubectl builds kubectl from the same release instead (for
# machines without one: Debian's kubernetes-client is 1.20, too old).
# KUBE_CMD=kubelet, kube-controller-manager or kube-scheduler builds those
# (internal/kubetest runs them for the tests on real kubelets).
#
# The module's go.mod points every k8s.io/<x> at ./staging/src/..., which the
# module zip does not hold: those replace lines are dropped and each
# k8s.io/<x> v0.0.0 requirement pinned to the matching v0.x release.
set -euo pipefail
ver="${1:-${KUBE_VERSION:-v1.34.2}}"
minor="v0.${ver#v1.}"
cache="${KUBE_CACHE:-/var/cache/hyperpodrun}"
cmd="${KUBE_CMD:-kube-apiserver}"
case "$cmd" in kube-apiserver|kubectl|kubelet|kube-controller-manager|kube-scheduler) ;; *) echo "kube-apiserver.sh: KUBE_CMD must be kube-apiserver, kubectl, kubelet, kube-controller-manager or kube-scheduler, not $cmd" >&2; exit 2;; esac
bin="$cache/$cmd-$ver"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache"
export PATH="/usr/local/go/bin:$PATH" GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=auto
src=$(go mod download -json "k8s.io/kubernetes@$ver" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[ -n "$src" ] || { echo "kube-apiserver.sh: go mod download k8s.io/kubernetes@$ver failed" >&2; exit 1; }
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src/." "$work/" && chmod -R u+w "$work"
cd "$work"
rm -f go.work go.work.sum
sed -i -E '/^\s*k8s\.io\/[a-z0-9-]+ => \.\/staging/d; /^replace k8s\.io\/[a-z0-9-]+ => \.\/staging/d' go.mod
sed -i -E "s#^(\s*k8s\.io/[a-z0-9-]+) v0\.0\.0\$#\1 $minor#" go.mod
echo "kube-apiserver.sh: building $cmd $ver (10-20 minutes on 2 cores)" >&2
# -trimpath keeps the copy's temporary path out of the build cache's keys:
# the next command of the same release (kubelet after kube-apiserver)
# reuses every package compiled for this one instead of compiling
# k8s.io/kubernetes again, which keeps a fresh machine's CI under an hour.
nice -n 19 go build -trimpath -o "$bin.tmp" "./cmd/$cmd"
mv "$bin.tmp" "$bin"
echo "$bin"
