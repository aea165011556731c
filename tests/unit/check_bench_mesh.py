#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Smoke test of scripts/bench_mesh.py (erasure coding through the real
daemons): a 2+1 mesh, 4 MiB per node, 5 steps. It must protect every step,
rebuild the lost node, have every rank restore and check the step, and
report every figure; no figure is compared with a target (a benchmark, not
a timed test)."""
import json
import os
import subprocess
import sys

build = sys.argv[1]
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench_mesh.py")
p = subprocess.run([sys.executable, script, build, "--shape", "2+1", "--size", "4M", "--steps", "5", "--json"],
                   capture_output=True, text=True, timeout=600)
if p.returncode != 0:
    sys.exit(f"FAIL: bench_mesh exited {p.returncode}: {p.stdout[-2000:]} {p.stderr[-2000:]}")
out = json.loads(p.stdout.strip().splitlines()[-1])
want = ("protect_gbps", "protect_cold_gbps", "rebuild_gbps", "relaunch_to_serving_s", "relaunch_to_restored_s",
        "protect_vs_mpi_move", "rebuild_vs_raw_decode")
bad = [k for k in want if not (isinstance(out.get(k), (int, float)) and out[k] > 0)]
bad += [f"library.{k}" for k, v in out.get("library", {}).items() if not v > 0] if out.get("library") else ["library"]
if bad or out.get("steps") != 5 or out.get("lost_nodes") != [0] or out.get("protected_bytes", 0) < 3 * (4 << 20) \
        or out.get("restored_bytes_checked") != 3 * (4 << 20) or len(out.get("protect_cold_s", [])) != 4:
    sys.exit(f"FAIL: bench_mesh reported {out}; missing or not positive: {bad}")
print(f"bench_mesh: protect {out['protect_gbps']:.2f} GB/s ({out['protect_vs_mpi_move']:.2f} of MPI move), "
      f"rebuild {out['rebuild_gbps']:.2f} GB/s, every field present")
