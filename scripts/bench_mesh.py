#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Erasure coding through the real daemons, side by side in one run with the
physical limits the ec/ library is measured against (`snaptool bench ec`).

  mpirun -np NODES snapsmp --ec K+M   (stores in /dev/shm, one per node)
  + one example trainer per node saving SIZE bytes per step.

Protect: the trainers save one step at a time (each step only after every
node logged the previous one protected, so protects do not compete with
saves for the cores); the figure is the daemons' own protect time (the
slowest node's log line: map + encode + publish + agree), as GB of protected
data (NODES x SIZE) per second. The first SNAP_SLOTS + 1 steps are "cold"
(the daemon maps each slot file once and reuses the previous protected
step's parity file from then on, docs/design.md "Protect"); the steady
figure is the median of the steps after them.

Rebuild: SIGKILL of the mesh, the stores of M nodes of group 0 deleted,
relaunch; the figure is the slowest rebuilt node's logged rebuild time,
again as GB of protected data per second, and relaunch -> serving. Every
trainer then restores the step and checks every byte (trainer --resume).

Then `snaptool bench ec` with the same K, M and SIZE gives, in the same run,
MPI moving the same traffic (the target for protect: >= 0.7 of it), raw
ISA-L decode (the target for rebuild: >= 0.5 of it), and the library's own
end-to-end figures over warm buffers.

usage: scripts/bench_mesh.py BUILD_DIR [--shape 3+1] [--nodes N] [--size 256M] [--steps 8] [--json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fault"))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, groups_of, restored_of, setup, start_trainers  # noqa: E402

PROT = re.compile(rf"job {JOB} step (\d+) protected \(group \d+, \d+\+\d+, (\d+) data \+ (\d+) parity bytes here, "
                  r"([\d.]+) ms")
REBUILT = re.compile(rf"job {JOB} step (\d+): rebuilt this lost node; .*?, ([\d.]+) ms \(files ([\d.]+), "
                     r"exchange ([\d.]+), publish ([\d.]+)\)")


def size_of(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--shape", default="3+1")
    ap.add_argument("--nodes", type=int, default=0, help="default K+M")
    ap.add_argument("--size", default="256M", help="bytes per node (one trainer per node)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    k, m = map(int, a.shape.split("+"))
    a.nodes = a.nodes or k + m
    a.world, a.bytes = a.nodes, a.size
    slots = 3
    if a.steps < slots + 2:
        sys.exit(f"bench_mesh: --steps must be at least {slots + 2} (the first {slots + 1} are cold)")
    size = size_of(a.size)
    base, logdir = setup(a, "snapbench-mesh")
    budget = 4 * size + 4 * (m * size // k) + (64 << 20)
    mesh = Mesh(a, base, ["--mem-limit", str(budget)])
    waiter = Waiter()
    waiter.watch(logdir)
    env = {"SNAP_TIMEOUT_MS": "120000"}
    out = {"shape": a.shape, "nodes": a.nodes, "size": size, "steps": a.steps}
    try:
        mesh.start(os.path.join(logdir, "mesh.log"))
        per_step = {}
        for s in range(1, a.steps + 1):
            for p, log, err in start_trainers(a, mesh, logdir, f"s{s}", s, env_over=env):
                if p.wait() != 0:
                    sys.exit(f"bench_mesh: a trainer failed at step {s}; see {err}")
            if not waiter.until(lambda: len([x for x in PROT.findall(mesh.text()) if int(x[0]) == s]) >= a.nodes,
                                limit=600):
                sys.exit(f"bench_mesh: step {s} was not protected on every node; see {mesh.log}")
            lines = [x for x in PROT.findall(mesh.text()) if int(x[0]) == s]
            data = sum(int(x[1]) for x in lines)
            per_step[s] = (max(float(x[3]) for x in lines) / 1e3, data)
        cold = [per_step[s][0] for s in range(1, slots + 2)]
        steady = [per_step[s][0] for s in range(slots + 2, a.steps + 1)]
        data = per_step[a.steps][1]
        out.update(protected_bytes=data, protect_cold_s=cold, protect_steady_s=statistics.median(steady),
                   protect_gbps=data / statistics.median(steady) / 1e9, protect_cold_gbps=data / max(cold) / 1e9)

        lost = groups_of(a.nodes, k, m)[0][:m]
        mesh.kill()
        for n in lost:
            shutil.rmtree(mesh.root(n))
        t0 = time.monotonic()
        mesh.start(os.path.join(logdir, "relaunch.log"))
        serving = time.monotonic() - t0
        rb = [x for x in REBUILT.findall(mesh.text()) if int(x[0]) == a.steps]
        if len(rb) != len(lost):
            sys.exit(f"bench_mesh: {len(rb)} of {len(lost)} lost nodes logged their rebuild; see {mesh.log}")
        rebuild_s = max(float(x[1]) for x in rb) / 1e3
        procs = start_trainers(a, mesh, logdir, "check", a.steps, env_over=env)
        for p, log, err in procs:
            if p.wait() != 0 or restored_of(log) != a.steps:
                sys.exit(f"bench_mesh: after the rebuild a trainer did not restore step {a.steps} intact; see {err}")
        restored = time.monotonic() - t0
        mesh.stop()
        out.update(lost_nodes=lost, relaunch_to_serving_s=serving, relaunch_to_restored_s=restored, rebuild_s=rebuild_s,
                   rebuild_phases_ms={"files": max(float(x[2]) for x in rb),
                                      "exchange": max(float(x[3]) for x in rb),
                                      "publish": max(float(x[4]) for x in rb)},
                   rebuild_gbps=data / rebuild_s / 1e9, restored_bytes_checked=a.nodes * size)
    finally:
        mesh.kill()
        shutil.rmtree(base, ignore_errors=True)

    p = subprocess.run([os.path.join(a.build, "tools", "snaptool"), "bench", "ec", "--k", str(k), "--m", str(m),
                        "--size", str(size), "--reps", "3", "--json"], capture_output=True, text=True)
    lib = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    if not lib:
        sys.exit(f"bench_mesh: snaptool bench ec failed: {p.stderr.strip()}")
    out["library"] = {x: lib[x] for x in ("mpi_move_gbps", "raw_encode_gbps", "mesh_encode_gbps",
                                          "raw_decode_gbps", "rebuild_gbps")}
    out["protect_vs_mpi_move"] = out["protect_gbps"] / lib["mpi_move_gbps"]
    out["rebuild_vs_raw_decode"] = out["rebuild_gbps"] / lib["raw_decode_gbps"]
    shutil.rmtree(logdir, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
        return 0
    g = out["library"]
    print(f"mesh bench: {a.nodes} nodes ({a.shape}) of real snapsmp daemons on this host, {a.size} per node, "
          f"{data / 1e9:.2f} GB of protected data per step; GB/s of protected data")
    print("| | daemons | library over MPI, warm buffers | physical limit (same run) | daemons / limit |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| protect (steady, median of steps {slots + 2}-{a.steps}) | {out['protect_gbps']:.2f} "
          f"({1e3 * out['protect_steady_s']:.0f} ms) | {g['mesh_encode_gbps']:.2f} | MPI move {g['mpi_move_gbps']:.2f} "
          f"| {out['protect_vs_mpi_move']:.2f} (target 0.7) |")
    print(f"| protect (cold, steps 1-{slots + 1}) | {out['protect_cold_gbps']:.2f} "
          f"({', '.join(f'{1e3 * c:.0f}' for c in cold)} ms) | | | |")
    ph = out["rebuild_phases_ms"]
    print(f"| rebuild of {len(lost)} lost node(s) at relaunch | {out['rebuild_gbps']:.2f} "
          f"({1e3 * rebuild_s:.0f} ms: files {ph['files']:.0f}, exchange {ph['exchange']:.0f}) | "
          f"{g['rebuild_gbps']:.2f} | raw ISA-L decode {g['raw_decode_gbps']:.2f} | "
          f"{out['rebuild_vs_raw_decode']:.3f} (target 0.5) |")
    print(f"relaunch -> serving {serving:.2f} s; -> every rank restored step {a.steps} and checked its bytes "
          f"{out['relaunch_to_restored_s']:.2f} s (trainers started after serving)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
