#!/usr/bin/env python3
"""Convert Gavel's Philly-derived per-virtual-cluster traces to an
`elasticctl simulate` CSV trace and a teams file.

Source (MIT licence): https://github.com/stanford-futuredata/gavel
  scheduler/traces/msr/seed=0/<vc>.trace  one Philly virtual cluster each
  scheduler/simulation_throughputs.json   measured steps/s per job type

Each .trace line is tab-separated: job type, command, steps flag,
needs-data-dir, total steps, arrival time (s), scale factor (GPUs), ...
A job's run time is total_steps / throughput[v100][(job type, scale
factor)]["null"] (Gavel's own simulator does the same; where Gavel has no
measurement at that scale, the largest measured scale below it is scaled
linearly), its work is run time x GPUs.

Assumptions (stated in README.md next to this script):
  * each Philly virtual cluster (VC) is a team, named vc-<id>;
  * the fleet is modelled as 1-GPU slots (acceleratorsPerNode: 1), so a
    job's size in "nodes" is its GPU count and placement is not a factor;
  * jobs with >= 2 GPUs are data-parallel and elastic between max(1, g/2)
    and 2g GPUs; 1-GPU jobs are static;
  * each team's nominal quota is its share of the trace's GPU-seconds times
    the fleet capacity (rounded, and at least its largest job).

Usage:
  git clone https://github.com/stanford-futuredata/gavel
  python3 convert_gavel_philly.py gavel 0e4a51,103959,2869ce,e13805 > philly-4vc.csv
The teams file is written to philly-4vc-teams.yaml (--teams to change).
"""
import argparse
import ast
import json
import math
import os
import sys


def throughput(rate, jtype, sf):
    """Steps/s of jtype on sf GPUs: measured, else the largest measured
    scale below sf scaled linearly (sf / that scale)."""
    if (jtype, sf) in rate:
        return rate[(jtype, sf)]
    lower = [s for (t, s) in rate if t == jtype and s < sf]
    if not lower:
        return None
    s = max(lower)
    return rate[(jtype, s)] * sf / s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gavel", help="path of a gavel checkout")
    ap.add_argument("vcs", help="comma-separated VC ids (file names under scheduler/traces/msr/seed=0)")
    ap.add_argument("--seed", default="0", help="Gavel's job-type seed directory")
    ap.add_argument("--load", type=float, default=1.0,
                    help="size the fleet so that mean offered load is this fraction of capacity")
    ap.add_argument("--teams", default="philly-4vc-teams.yaml")
    ap.add_argument("--max-days", type=float, default=0, help="keep only jobs submitted in the first N days (0: all)")
    a = ap.parse_args()

    with open(os.path.join(a.gavel, "scheduler/simulation_throughputs.json")) as f:
        thr = json.load(f)["v100"]
    rate = {}
    for k, v in thr.items():
        rate[ast.literal_eval(k)] = v["null"]

    jobs = []
    for vc in a.vcs.split(","):
        path = os.path.join(a.gavel, "scheduler/traces/msr", "seed=" + a.seed, vc + ".trace")
        with open(path) as f:
            for i, line in enumerate(f):
                p = line.rstrip("\n").split("\t")
                jtype, steps, arrival, sf = p[0], int(p[4]), float(p[5]), int(p[6])
                if a.max_days and arrival > a.max_days * 86400:
                    continue
                r = throughput(rate, jtype, sf)
                if not r:
                    sys.exit("%s:%d: no throughput for %r" % (path, i + 1, jtype))
                dur = steps / r
                jobs.append(dict(name="%s-%04d" % (vc, i), team="vc-" + vc, submit=arrival, gpus=sf,
                                 work=round(dur * sf, 1)))
    jobs.sort(key=lambda j: (j["submit"], j["name"]))
    span = max(j["submit"] for j in jobs) - min(j["submit"] for j in jobs)
    total = sum(j["work"] for j in jobs)
    capacity = int(math.ceil(total / span / a.load))
    out = sys.stdout
    out.write("# Converted by convert_gavel_philly.py from stanford-futuredata/gavel (MIT), Philly VCs %s; see README.md\n" % a.vcs)
    out.write("name,team,submit,gpus_per_node,nodes,min_nodes,max_nodes,elastic,work\n")
    for j in jobs:
        g = j["gpus"]
        el = g >= 2
        lo, hi = (max(1, g // 2), 2 * g) if el else (g, g)
        out.write("%s,%s,%g,1,%d,%d,%d,%s,%g\n" % (j["name"], j["team"], j["submit"], g, lo, hi,
                                                    "true" if el else "false", j["work"]))
    by = {}
    big = {}
    for j in jobs:
        by[j["team"]] = by.get(j["team"], 0) + j["work"]
        big[j["team"]] = max(big.get(j["team"], 0), j["gpus"])
    teams = sorted(by)
    quotas = {t: max(big[t], int(round(capacity * by[t] / total))) for t in teams}
    capacity = max(capacity, sum(quotas.values()))
    with open(a.teams, "w") as f:
        f.write("# Teams for the Philly trace (convert_gavel_philly.py): one per virtual cluster,\n")
        f.write("# nominal quota = the VC's share of the trace's GPU-seconds x the fleet; one cohort.\n")
        f.write("teams:\n")
        for t in teams:
            f.write("- name: %s\n  cohort: philly\n  preemption: LowerPriority\n  quotas:\n"
                    "  - flavor: v100\n    nominal: %d\n" % (t, quotas[t]))
        f.write("fleet:\n- flavor: v100\n  nodes: %d\n  acceleratorsPerNode: 1\n" % sum(quotas.values()))
    sys.stderr.write("%d jobs, span %.1f days, %.0f GPU-hours, capacity %d GPUs (load %.2f)\n" %
                     (len(jobs), span / 86400, total / 3600, sum(quotas.values()), total / span / sum(quotas.values())))


if __name__ == "__main__":
    main()
