#!/usr/bin/env bash
# Fails when the repository tracks a build output: an ELF file, or a file
# over 1 MiB that is not a documented fixture (listed below with why).
# Run by `make lint` and `make test` (so by CI).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# Large fixtures we keep on purpose, one path per line: none today.
fixtures=""
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  if [ "$(head -c4 "$f" | od -An -c | tr -d ' \n')" = "177ELF" ]; then
    echo "check-tree: $f is a compiled ELF file: remove it (git rm --cached) and build it into bin/ instead" >&2
    bad=1
  fi
  size=$(stat -c %s "$f")
  if [ "$size" -gt 1048576 ] && ! grep -qxF "$f" <<<"$fixtures"; then
    echo "check-tree: $f is $size bytes: keep files over 1 MiB out of the repository, or list it as a fixture in scripts/check-tree.sh with the reason" >&2
    bad=1
  fi
done < <(git ls-files -z)
exit "$bad"
