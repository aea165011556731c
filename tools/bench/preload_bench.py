#!/usr/bin/python3
"""Checkpoint time of an unmodified PyTorch program under libsnap_preload.so,
side by side with what users do without it and with the physical limits.

    tools/bench/preload_bench.py --build build/gcc [--gib 1] [--repeat 3]
        [--disk /tmp] [--shm /dev/shm]

Configurations (each a fresh python process that builds the state once and
times torch.save --repeat times, median reported):
  disk+fsync  torch.save to --disk, then fsync (what survives a crash)
  shm         torch.save to /dev/shm (memory speed, survives nothing but the process)
  preload     torch.save to a captured directory on --disk under the preload with
              a real snapsmp (node store in /dev/shm): returns when the file is
              committed in the node store; snapsmp flushes it to disk behind
  preload+flush  the same plus the wait until snapsmp has it on disk (fsynced)
Limits: memcpy bandwidth of this machine (numpy copy of the same bytes) and
the disk's write+fsync bandwidth (dd). Then dd outside the captured directory
with and without the preload (4 KiB writes to /dev/null: pure call overhead,
and to /dev/shm), the cost the preload must not add to other I/O.
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--gib", type=float, default=1.0)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--disk", default="/tmp")
ap.add_argument("--shm", default="/dev/shm")
args = ap.parse_args()

BUILD = os.path.abspath(args.build)
SMP = os.path.join(BUILD, "smp", "snapsmp")
PRELOAD = os.path.join(BUILD, "integration", "libsnap_preload.so")
TAG = f"snapbench-preload-{os.getpid()}"
DISK = os.path.join(args.disk, TAG)
SHM = os.path.join(args.shm, TAG)
STORE = os.path.join(args.shm, TAG + "-store")
CAP = os.path.join(args.disk, TAG + "-cap")

SAVER = r"""
import os, sys, time, torch
torch.set_num_threads(1)
gib, repeat, target, fsync, wait_flush = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
n = int(gib * (1 << 30) / 4 / 16)
g = torch.Generator().manual_seed(0)
state = {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(16)}   # incompressible, like weights
times = []
for r in range(repeat):
    path = os.path.join(target, f"ckpt-{r}.pt")
    t0 = time.perf_counter()
    torch.save(state, path + ".tmp")
    if fsync:
        fd = os.open(path + ".tmp", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    os.replace(path + ".tmp", path)
    t1 = time.perf_counter()
    if wait_flush:   # until snapsmp has it on disk: the real file appears (renamed in after fsync)
        real = path
        while not os.path.exists(os.path.join(wait_flush, os.path.basename(real))):
            time.sleep(0.001)
    t2 = time.perf_counter()
    times.append((t1 - t0, t2 - t0))
    if r:
        os.remove(os.path.join(target, f"ckpt-{r - 1}.pt"))
print("TIMES", " ".join(f"{a:.4f},{b:.4f}" for a, b in times))
print("BYTES", os.stat(path).st_size)
"""


def run_saver(target, fsync=False, preload=False, wait_flush=""):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env.update(LD_PRELOAD=PRELOAD, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="bench")
    r = subprocess.run([sys.executable, "-c", SAVER, str(args.gib), str(args.repeat), target, "1" if fsync else "0",
                        wait_flush], env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode:
        sys.exit(f"saver failed: {r.stderr}")
    times = [tuple(map(float, x.split(","))) for x in re.search(r"TIMES (.*)", r.stdout).group(1).split()]
    size = int(re.search(r"BYTES (\d+)", r.stdout).group(1))
    warn = [l for l in r.stderr.splitlines() if "libsnap preload" in l]
    if warn:
        sys.exit(f"the preload fell back, the measurement would be of the disk: {warn}")
    return times, size


def dd(of, bs, count, preload):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env.update(LD_PRELOAD=PRELOAD, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="bench")
    best = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={of}", f"bs={bs}", f"count={count}", "status=none"], env=env,
                       check=True)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def memcpy_gbps(nbytes):
    import numpy as np
    a = np.ones(nbytes // 8, dtype=np.float64)
    b = np.empty_like(a)
    np.copyto(b, a)
    t0 = time.perf_counter()
    for _ in range(3):
        np.copyto(b, a)
    return 3 * nbytes / (time.perf_counter() - t0) / 1e9


def disk_gbps(nbytes):
    path = os.path.join(DISK, "dd.bin")
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={nbytes >> 22}", "conv=fsync",
                    "status=none"], check=True)
    dt = time.perf_counter() - t0
    os.remove(path)
    return nbytes / dt / 1e9


def main():
    for d in (DISK, SHM, CAP):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    shutil.rmtree(STORE, ignore_errors=True)
    nbytes = int(args.gib * (1 << 30))
    print(f"state: {args.gib:g} GiB of float32 in 16 tensors, torch.save x{args.repeat} per configuration "
          f"(median), {os.cpu_count()} cores", flush=True)
    mem, disk = memcpy_gbps(nbytes), disk_gbps(nbytes)
    print(f"limits: memcpy {mem:.2f} GB/s ({nbytes / mem / 1e9:.3f} s for the state); disk write+fsync "
          f"{disk:.2f} GB/s ({nbytes / disk / 1e9:.3f} s)", flush=True)

    res = {}
    t, size = run_saver(DISK, fsync=True)
    res["disk+fsync"] = statistics.median(a for a, _ in t)
    t, _ = run_saver(SHM)
    res["shm"] = statistics.median(a for a, _ in t)
    smp = subprocess.Popen([SMP, "--store", STORE, "--mem-limit", f"{int(3 * args.gib + 1)}G", "--quiet"])
    try:
        while not os.path.exists(os.path.join(STORE, "smp.sock")):
            time.sleep(0.01)
        # /proc/self/root + CAP: the same directory under a spelling the preload does not capture,
        # so the wait sees the real file system, not the store.
        t, _ = run_saver(CAP, preload=True, wait_flush="/proc/self/root" + CAP)
        res["preload"] = statistics.median(a for a, _ in t)
        res["preload+flush"] = statistics.median(b for _, b in t)
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
    print(f"checkpoint file: {size / 1e9:.3f} GB", flush=True)
    for k, v in res.items():
        print(f"  torch.save {k:14s} {v:7.3f} s  {size / v / 1e9:6.2f} GB/s", flush=True)
    print(f"ratios: preload is {res['disk+fsync'] / res['preload']:.2f}x faster than disk+fsync (target >= 5), "
          f"{res['preload'] / res['shm']:.2f}x the time of /dev/shm (target <= 1.3); "
          f"until on disk: {res['preload+flush'] / res['disk+fsync']:.2f}x disk+fsync", flush=True)

    # Other I/O under the preload: dd outside the captured directory.
    out = os.path.join(SHM, "dd.out")
    for of, bs, count, what in (("/dev/null", "4k", 1 << 20, "4 KiB writes to /dev/null (call overhead)"),
                                (out, "4k", 1 << 18, "4 KiB writes to /dev/shm (1 GiB)"),
                                (out, "1M", 1 << 10, "1 MiB writes to /dev/shm (1 GiB)")):
        a, b = dd(of, bs, count, False), dd(of, bs, count, True)
        print(f"  dd {what:42s} without {a:6.3f} s  with preload {b:6.3f} s  ratio {b / a:.3f}", flush=True)
    for d in (DISK, SHM, CAP, STORE):
        shutil.rmtree(d, ignore_errors=True)


main()
