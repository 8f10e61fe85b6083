#!/usr/bin/env bash
# Builds a real Jaeger v2 (the all-in-one `jaeger` binary: OTLP receiver,
# in-memory storage, query API and UI) from github.com/jaegertracing/jaeger at
# a pinned release through the Go module proxy, and caches it outside the
# repository. Prints the binary's path. Usage: scripts/jaeger.sh [version]
#
# `go install` refuses the module (its go.mod has replace directives), so the
# module's source is copied out of the module cache and built in place.
set -euo pipefail
ver="${1:-${JAEGER_VERSION:-v1.76.0}}"
cache="${JAEGER_CACHE:-/var/cache/hyperpodrun}"
bin="$cache/jaeger-$ver"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache"
export PATH="/usr/local/go/bin:$PATH" GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=auto
src=$(go mod download -json "github.com/jaegertracing/jaeger@$ver" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[ -n "$src" ] || { echo "jaeger.sh: go mod download github.com/jaegertracing/jaeger@$ver failed" >&2; exit 1; }
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src/." "$work/" && chmod -R u+w "$work"
cd "$work"
rm -f go.work go.work.sum
echo "jaeger.sh: building jaeger $ver (a few minutes on 2 cores)" >&2
nice -n 19 go build -trimpath -o "$bin.tmp" ./cmd/jaeger
mv "$bin.tmp" "$bin"
echo "$bin"
