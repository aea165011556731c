#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpoint time of an unmodified PyTorch program under libsnap_preload.so,
side by side with what users do without it and with the physical limits.

    tools/bench/preload_bench.py --build build/gcc [--gib 1] [--repeat 3]
        [--disk /tmp] [--shm /dev/shm]

Configurations (one python process each that builds the state once; they
take turns, --repeat saves each, median reported):
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

# One long-lived process per configuration, saving on command: the
# configurations take turns, so a machine whose load drifts (others build
# beside us) biases none of them.
SAVER = r"""
import os, sys, time, torch
torch.set_num_threads(1)
gib, target, fsync, wait_flush = float(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4]
n = int(gib * (1 << 30) / 4 / 16)
g = torch.Generator().manual_seed(0)
state = {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(16)}   # incompressible, like weights
print("READY", flush=True)
for line in sys.stdin:
    r = int(line)
    path = os.path.join(target, f"ckpt-{r}.pt")
    t0 = time.perf_counter()
    torch.save(state, path + ".tmp")
    if fsync:
        fd = os.open(path + ".tmp", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    os.replace(path + ".tmp", path)
    t1 = time.perf_counter()
    if wait_flush:   # until snapsmp has it on disk (the real file is renamed in after its fsync)
        while not os.path.exists(os.path.join(wait_flush, os.path.basename(path))):
            time.sleep(0.001)
    t2 = time.perf_counter()
    size = os.stat(path).st_size
    if r:
        os.remove(os.path.join(target, f"ckpt-{r - 1}.pt"))
    print(f"TIME {t1 - t0:.4f} {t2 - t0:.4f} {size}", flush=True)
"""


class Saver:
    def __init__(self, target, fsync=False, preload=False, wait_flush=""):
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if preload:
            env.update(LD_PRELOAD=PRELOAD, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="bench")
        self.p = subprocess.Popen([sys.executable, "-c", SAVER, str(args.gib), target, "1" if fsync else "0",
                                   wait_flush], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.times, self.flushed, self.size = [], [], 0
        if self.p.stdout.readline().strip() != "READY":
            sys.exit(f"saver failed: {self.p.stderr.read()}")

    def save(self, r):
        self.p.stdin.write(f"{r}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().split()
        if not line:
            sys.exit(f"saver failed: {self.p.stderr.read()}")
        self.times.append(float(line[1]))
        self.flushed.append(float(line[2]))
        self.size = int(line[3])

    def close(self):
        self.p.stdin.close()
        err = self.p.stderr.read()
        self.p.wait()
        warn = [l for l in err.splitlines() if "libsnap preload" in l]
        if warn:
            sys.exit(f"the preload fell back, the measurement would be of the disk: {warn}")


def dd_pair(of, bs, count):
    """Best of 5 runs each, with and without the preload, taking turns."""
    best = [None, None]
    for _ in range(5):
        for k, preload in enumerate((False, True)):
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            if preload:
                env.update(LD_PRELOAD=PRELOAD, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="bench")
            t0 = time.perf_counter()
            subprocess.run(["dd", "if=/dev/zero", f"of={of}", f"bs={bs}", f"count={count}", "status=none"], env=env,
                           check=True)
            dt = time.perf_counter() - t0
            best[k] = dt if best[k] is None else min(best[k], dt)
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

    smp = subprocess.Popen([SMP, "--store", STORE, "--mem-limit", f"{int(3 * args.gib + 1)}G", "--quiet"])
    try:
        while not os.path.exists(os.path.join(STORE, "smp.sock")):
            time.sleep(0.01)
        savers = {"disk+fsync": Saver(DISK, fsync=True), "shm": Saver(SHM),
                  # /proc/self/root + CAP: the same directory under a spelling the preload does not
                  # capture, so the wait for the flush sees the real file system, not the store.
                  "preload": Saver(CAP, preload=True, wait_flush="/proc/self/root" + CAP)}
        for r in range(args.repeat):
            for sv in savers.values():
                sv.save(r)
        for sv in savers.values():
            sv.close()
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
    res = {k: statistics.median(sv.times) for k, sv in savers.items()}
    res["preload+flush"] = statistics.median(savers["preload"].flushed)
    size = savers["shm"].size
    print(f"checkpoint file: {size / 1e9:.3f} GB", flush=True)
    for k, v in res.items():
        print(f"  torch.save {k:14s} {v:7.3f} s  {size / v / 1e9:6.2f} GB/s", flush=True)
    print(f"ratios: preload is {res['disk+fsync'] / res['preload']:.2f}x faster than disk+fsync (target >= 5), "
          f"{res['preload'] / res['shm']:.2f}x the time of /dev/shm (target <= 1.3); "
          f"until on disk: {res['preload+flush'] / res['disk+fsync']:.2f}x disk+fsync", flush=True)

    # The same bytes without torch's serializer (its zip CRC32 is CPU-bound): dd with 64 MiB writes.
    smp = subprocess.Popen([SMP, "--store", STORE, "--mem-limit", f"{int(3 * args.gib + 1)}G", "--quiet"])
    while not os.path.exists(os.path.join(STORE, "smp.sock")):
        time.sleep(0.01)
    count = max(1, nbytes >> 26)
    raw = {"disk+fsync": [], "shm": [], "preload": []}
    for r in range(args.repeat):
        for k, of, extra, pre in (("disk+fsync", os.path.join(DISK, "raw.bin"), ["conv=fsync"], False),
                                  ("shm", os.path.join(SHM, "raw.bin"), [], False),
                                  ("preload", os.path.join(CAP, f"raw-{r}.bin"), [], True)):
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            if pre:
                env.update(LD_PRELOAD=PRELOAD, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="bench")
            t0 = time.perf_counter()
            subprocess.run(["dd", "if=/dev/zero", f"of={of}", "bs=64M", f"count={count}", "status=none", *extra],
                           env=env, check=True)
            raw[k].append(time.perf_counter() - t0)
            if pre and r:
                subprocess.run(["rm", "-f", os.path.join(CAP, f"raw-{r - 1}.bin")], env=env, check=True)
    smp.send_signal(signal.SIGTERM)
    smp.wait()
    raw = {k: statistics.median(v) for k, v in raw.items()}
    for k, v in raw.items():
        print(f"  dd bs=64M {k:14s} {v:7.3f} s  {count * 64 * 2**20 / v / 1e9:6.2f} GB/s", flush=True)
    print(f"ratios (dd): preload is {raw['disk+fsync'] / raw['preload']:.2f}x faster than disk+fsync, "
          f"{raw['preload'] / raw['shm']:.2f}x the time of /dev/shm", flush=True)

    # Other I/O under the preload: dd outside the captured directory.
    out = os.path.join(SHM, "dd.out")
    for of, bs, count, what in (("/dev/null", "4k", 1 << 19, "4 KiB writes to /dev/null (call overhead)"),
                                (out, "4k", 1 << 18, "4 KiB writes to /dev/shm (1 GiB)"),
                                (out, "1M", 1 << 10, "1 MiB writes to /dev/shm (1 GiB)")):
        a, b = dd_pair(of, bs, count)
        print(f"  dd {what:42s} without {a:6.3f} s  with preload {b:6.3f} s  ratio {b / a:.3f}", flush=True)
    for d in (DISK, SHM, CAP, STORE):
        shutil.rmtree(d, ignore_errors=True)


main()
