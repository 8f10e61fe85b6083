#!/usr/bin/env bash
# The main demo: real PyTorch DDP training under hyperpodrun --standalone
# with 4 workers (no etcd or other setup). Without PyTorch it says how to
# install it and runs the small bundled worker instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
PY=${PYTHON_EXEC:-/usr/bin/python3}
if "$PY" -c 'import torch.distributed' 2>/dev/null; then
  echo "== hyperpodrun --standalone --nproc-per-node 4 examples/pytorch/train_ddp.py (PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), gloo)"
  PYTHON_EXEC="$PY" exec "$BIN/hyperpodrun" --standalone --nproc-per-node 4 examples/pytorch/train_ddp.py --steps 40
fi
echo "PyTorch is not installed for $PY: on Debian run 'apt-get install python3-torch'"
echo "(or point PYTHON_EXEC at a Python with torch). Running the bundled worker instead."
go build -o "$BIN/worker" ./examples/worker
exec "$BIN/hyperpodrun" --standalone --nproc-per-node 4 --no-python "$BIN/worker" --steps 20
