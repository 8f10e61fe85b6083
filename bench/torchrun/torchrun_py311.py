"""Debian torch 1.13's torchrun on Python 3.11, for anchor measurements.

Its own entry point crashes (Std.from_str relies on pre-3.11 IntFlag behaviour);
this replaces Std.from_str with a by-value parser and runs torch.distributed.run.main().
Usage: /usr/bin/python3 torchrun_py311.py [torchrun args...]
"""
import re, sys
from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.api import Std
def from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return Std(int(vm))
    d = {}
    for m in vm.split(","):
        i, v = m.split(":")
        d[int(i)] = Std(int(v))
    return d
Std.from_str = staticmethod(from_str)
from torch.distributed import run
sys.argv[0] = "torchrun"
run.main()
