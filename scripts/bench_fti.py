#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap's erasure-coded mesh against FTI's level 3, at equal protection,
in one run (the target: both checkpoint -> protected and lost-node recovery
>= 5x faster than FTI's).

Equal protection: 4 nodes, our K+M = 2+2 against FTI's Reed-Solomon level 3
in a group of 4 (each node keeps its data and an encoded part as large):
both hold 2x the data and survive any 2 lost nodes. One process plays one
node on this host; every store and checkpoint directory is under --dir
(default /dev/shm; a tmpfs mounted huge=within_size puts both on huge pages).

FTI (tools/bench/fti/ftibench.c, compiled here with mpicc against --fti):
  checkpoint: FTI_Checkpoint(level 3) of SIZE per rank, the slowest rank,
              median of --reps, each of new contents;
  recovery:   the local directories of nodes 0 and 1 deleted, then
              mpirun ftibench recover: FTI_Init (which rebuilds them) and
              FTI_Recover into the buffer, every byte checked; the figure
              is mpirun's wall time (launch -> data verified in the buffers).
libsnap (snapbench mesh --k 2 --m 2, the same SIZE per node):
  checkpoint: save -> protected through the real daemons as the job sees
              it (the trainers told to save until every node logged the
              step protected), steady median; also the daemons' own protect
              time and the cold first steps;
  recovery:   the mesh SIGKILLed, the stores of nodes 0 and 1 deleted,
              relaunch -> every rank restored its step and checked every byte:
              once with the trainers started when the mesh serves, once with
              them started beside it, as integration/launch/mpirun.sh does (a
              trainer's own start-up, here allocating and clearing its buffer,
              then overlaps the rebuild; FTI's runs inside its application).

FTI is not packaged by Debian: build it from its source (cmake
-DCMAKE_BUILD_TYPE=Release -DENABLE_OPENSSL=OFF -DENABLE_EXAMPLES=OFF
-DENABLE_TESTS=OFF -DENABLE_FORTRAN=OFF, then make install) and pass the
install prefix. Without the build type FTI's CMake compiles with no
optimisation: its checkpoint then took 18.5 s instead of 5.3 s here, which
would flatter libsnap 3.5x.

usage: scripts/bench_fti.py BUILD_DIR --fti PREFIX [--size 256M] [--reps 3] [--dir /dev/shm] [--json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODES, LOST = 4, [0, 1]


def size_of(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)

CONFIG = """[Basic]
Head = 0
Node_size = 1
Ckpt_dir = {d}/local
Glbl_dir = {d}/global
Meta_dir = {d}/meta
Ckpt_L1 = 0
Ckpt_L2 = 0
Ckpt_L3 = 0
Ckpt_L4 = 0
Inline_L2 = 1
Inline_L3 = 1
Inline_L4 = 1
keep_last_ckpt = 0
Group_size = {nodes}
Verbosity = 3
max_sync_intv = 0
ckpt_io = 1
Enable_Staging = 0
Enable_dCP = 0
dCP_Mode = 0
dCP_Block_Size = 16384
[Restart]
Failure = 0
Exec_ID = XXXX-XX-XX_XX-XX-XX
[Injection]
rank = 0
number = 0
position = 0
frequency = 0
[Advanced]
Block_size = 1024
Transfer_size = 16
general_tag = 2612
ckpt_tag = 711
stage_tag = 406
final_tag = 3107
Local_test = 1
"""


def json_lines(text):
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def run_fti(a, size, work):
    exe = os.path.join(work, "ftibench")
    cc = subprocess.run(["mpicc", "-O2", "-Wall", "-o", exe, os.path.join(ROOT, "tools", "bench", "fti", "ftibench.c"),
                         f"-I{a.fti}/include", f"-L{a.fti}/lib", f"-Wl,-rpath,{a.fti}/lib", "-lfti", "-lz", "-lm"],
                        capture_output=True, text=True)
    if cc.returncode:
        sys.exit(f"bench_fti: cannot build ftibench against {a.fti}: {cc.stderr.strip()}")
    d = tempfile.mkdtemp(prefix="snapbench-fti-", dir=a.dir)
    for sub in ("local", "global", "meta"):
        os.makedirs(os.path.join(d, sub))
    cfg = os.path.join(d, "config.fti")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(d=d, nodes=NODES))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    mpi = [a.mpiexec, "-np", str(NODES), "--oversubscribe", exe]
    try:
        p = subprocess.run(mpi + ["ckpt", cfg, str(size), str(a.reps)], env=env, capture_output=True, text=True,
                           timeout=1800)
        ck = [x["s"] for x in json_lines(p.stdout) if x.get("fti") == "ckpt"]
        if len(ck) != a.reps:
            sys.exit(f"bench_fti: FTI checkpoints failed: {p.stdout[-2000:]} {p.stderr[-2000:]}")
        exec_id = os.listdir(os.path.join(d, "meta"))[0]
        for n in LOST:
            shutil.rmtree(os.path.join(d, "local", f"node{n}"))
        with open(cfg) as f:
            text = f.read()
        text = re.sub(r"(?im)^failure\s*=.*$", "failure = 1", text)
        text = re.sub(r"(?im)^exec_id\s*=.*$", f"exec_id = {exec_id}", text)
        with open(cfg, "w") as f:
            f.write(text)
        t0 = time.monotonic()
        p = subprocess.run(mpi + ["recover", cfg, str(size)], env=env, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t0
        rec = [x for x in json_lines(p.stdout) if x.get("fti") == "recover"]
        if not rec or not rec[0]["verified"] or rec[0]["version"] != a.reps:
            sys.exit(f"bench_fti: FTI did not recover the last checkpoint: {p.stdout[-2000:]} {p.stderr[-2000:]}")
        return {"ckpt_s": ck, "ckpt_median_s": statistics.median(ck), "recover_wall_s": wall,
                "init_s": rec[0]["init_s"], "recover_s": rec[0]["recover_s"]}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--fti", required=True, help="FTI install prefix (include/fti.h, lib/libfti.so)")
    ap.add_argument("--size", default="256M", help="bytes per node")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--dir", default="/dev/shm", help="where FTI's directories and libsnap's stores go")
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        ap.error(f"--dir {a.dir}: not a directory")
    size = size_of(a.size)
    with tempfile.TemporaryDirectory(prefix="snapbench-fti-") as work:
        fti = run_fti(a, size, work)
    p = subprocess.run([os.path.join(a.build, "tools", "snapbench"), "mesh", "--k", "2", "--m", "2", "--size",
                        str(size), "--steps", str(max(8, 4 + a.reps)), "--dir", a.dir, "--json"], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bench_fti: snapbench mesh failed: {p.stdout[-2000:]} {p.stderr[-2000:]}")
    snap = json.loads(p.stdout.strip().splitlines()[-1])
    out = {"nodes": NODES, "size": size, "lost_nodes": LOST, "fti": fti,
           "dir": a.dir, "snap": {x: snap[x] for x in ("save_to_protected_s", "protect_steady_s", "protect_cold_s",
                                         "relaunch_to_serving_s", "relaunch_to_restored_s", "rebuild_s",
                                         "relaunch_together_to_restored_s")}}
    out["protect_speedup"] = fti["ckpt_median_s"] / snap["save_to_protected_s"]
    out["protect_daemon_speedup"] = fti["ckpt_median_s"] / snap["protect_steady_s"]
    out["protect_cold_speedup"] = fti["ckpt_median_s"] / max(snap["protect_cold_s"])
    out["recovery_speedup"] = fti["recover_wall_s"] / snap["relaunch_to_restored_s"]
    out["recovery_together_speedup"] = fti["recover_wall_s"] / snap["relaunch_together_to_restored_s"]
    if a.json:
        print(json.dumps(out))
        return 0
    s = out["snap"]
    print(f"libsnap 2+2 mesh vs FTI level 3 (group of {NODES}), {NODES} nodes on this host, {a.size} per node, "
          f"nodes {LOST} lost; both under {a.dir}; target: >= 5x")
    print("| | FTI | libsnap | FTI / libsnap |")
    print("| --- | --- | --- | --- |")
    print(f"| checkpoint -> protected (median of {a.reps}) | {fti['ckpt_median_s']:.2f} s | "
          f"{s['save_to_protected_s']:.3f} s (save -> protected, steady) | {out['protect_speedup']:.1f}x |")
    print(f"| the same, the daemons' own protect time | | {s['protect_steady_s']:.3f} s | "
          f"{out['protect_daemon_speedup']:.1f}x |")
    print(f"| the same, libsnap's cold first steps | | {max(s['protect_cold_s']):.3f} s (slowest) | "
          f"{out['protect_cold_speedup']:.1f}x |")
    print(f"| launch -> lost nodes' data verified in every rank's buffers | {fti['recover_wall_s']:.2f} s "
          f"(FTI_Init {fti['init_s']:.2f}, FTI_Recover {fti['recover_s']:.2f}) | {s['relaunch_to_restored_s']:.2f} s "
          f"(serving after {s['relaunch_to_serving_s']:.2f}, rebuild {s['rebuild_s']:.2f}) | "
          f"{out['recovery_speedup']:.1f}x |")
    print(f"| the same, trainers launched with the mesh (integration/launch/mpirun.sh) | | "
          f"{s['relaunch_together_to_restored_s']:.2f} s | {out['recovery_together_speedup']:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
