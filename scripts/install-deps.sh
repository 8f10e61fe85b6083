#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine (as root):
# Debian's PyTorch, etcd, containerd, runc, registry, chromium, ...; then a
# real kube-apiserver built from source (cached in /var/cache/hyperpodrun).
# `make test` runs it when run as root and something is missing; .ci/run
# runs it on every fresh CI machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: run as root (sudo bash scripts/install-deps.sh): it installs Debian packages" >&2
  exit 2
fi
apt-get update -qq
# python3-torch: real PyTorch DDP (gloo) end-to-end tests; etcd-server: the
# tests against Debian's etcd 3.4 binary (killed and restarted for outage
# tests); etcd-client: etcdctl move-leader under a job (issue 27);
# util-linux: unshare (PID 1 test); python3-etcd: torch's etcd
# rendezvous, for make bench's torchrun anchors; numactl: --numa-binding;
# chromium: pages rendered headless; containerd, runc, docker-registry and
# busybox-static: the containerd runtime's tests (a private containerd per
# test, a loopback registry, images built from busybox); libc6-dev's static
# libc links bin/hyperpodrun-static; containernetworking-plugins: the
# loopback CNI plugin of the real kubelet's tests (internal/kubetest).
apt-get install -y -qq --no-install-recommends \
  python3-torch python3-etcd etcd-server etcd-client util-linux procps ca-certificates curl unzip make git gcc libc6-dev \
  numactl chromium containerd runc docker-registry busybox-static containernetworking-plugins >/dev/null
# The packages may start a system containerd, registry and etcd; tests use
# their own (private root, state, socket and port).
