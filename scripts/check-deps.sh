#!/usr/bin/env bash
# `make test`'s first step: checks that what the tests need is installed.
# As root it installs what is missing (scripts/install-deps.sh, and a real
# kube-apiserver built by scripts/kube-apiserver.sh, about 20 minutes once);
# otherwise it says exactly what to run.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for bin in /usr/bin/etcd /usr/bin/etcdctl containerd runc docker-registry busybox chromium numactl unshare gcc; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
/usr/bin/python3 -c 'import torch, etcd' >/dev/null 2>&1 || missing+=("python3-torch/python3-etcd")
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "check-deps: installing what the tests need (missing: ${missing[*]})" >&2
    bash scripts/install-deps.sh
  else
    echo "check-deps: the tests need ${missing[*]}: run 'sudo bash scripts/install-deps.sh' (Debian), then make test again" >&2
    exit 1
  fi
fi
apiserver=$(KUBE_APISERVER= bash -c 'cache="${KUBE_CACHE:-/var/cache/hyperpodrun}"; echo "$cache/kube-apiserver-${KUBE_VERSION:-v1.34.2}"')
if [ -z "${KUBE_APISERVER:-}" ] && [ ! -x "$apiserver" ]; then
  if [ "$(id -u)" = 0 ] || [ -w "$(dirname "$apiserver")" ]; then
    echo "check-deps: building a real kube-apiserver for the Kubernetes tests (about 20 minutes, once; cached in $(dirname "$apiserver"))" >&2
    bash scripts/kube-apiserver.sh >/dev/null
  else
    echo "check-deps: the Kubernetes tests need a kube-apiserver: run 'sudo bash scripts/kube-apiserver.sh' (about 20 minutes, cached), or set KUBE_APISERVER" >&2
    exit 1
  fi
fi
