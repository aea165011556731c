#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Host stall of libsnap.torch's Checkpointer.save() on the CPU: the Python
side of a save (building or reusing the plan, filling payloads) apart from
the snap_save C call itself, on a 12-layer stack of Linear/LayerNorm with
AdamW after its first step (146 parameters, 588 regions). A snapsmp it starts serves
the saves; each save is waited for (outside the timing) before the next.

usage: bench_save_stall.py --snapsmp BIN [--saves 100] [--layers 12] [--width 256] [--profile]
"""
import argparse
import cProfile
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--snapsmp", required=True)
ap.add_argument("--saves", type=int, default=100)
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()

from libsnap.torch import Checkpointer   # noqa: E402

store = f"/dev/shm/snap-stall-{os.getpid()}"
shutil.rmtree(store, ignore_errors=True)
smp = subprocess.Popen([args.snapsmp, "--store", store, "--mem-limit", "2G", "--quiet"], start_new_session=True,
                       stdin=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(store, "smp.sock")):
        if smp.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("snapsmp did not start")
        time.sleep(0.01)
    torch.manual_seed(0)
    w = args.width
    layers = []
    for _ in range(args.layers):
        # a GPT block's parameters: LayerNorm, qkv and output projections,
        # LayerNorm, the MLP's two Linear
        layers += [torch.nn.LayerNorm(w), torch.nn.Linear(w, 3 * w), torch.nn.Linear(w, w),
                   torch.nn.LayerNorm(w), torch.nn.Linear(w, 4 * w), torch.nn.Linear(4 * w, w)]
    layers.append(torch.nn.LayerNorm(w))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sum((p * p).sum() for p in model.parameters()).backward()   # a gradient for every parameter
    opt.step()
    os.environ["SNAP_STORE"] = store
    ck = Checkpointer(model, opt, job="stall")
    c_call = []
    real = ck._ctx.save

    def timed(*a, **k):
        t = time.perf_counter()
        r = real(*a, **k)
        c_call.append(time.perf_counter() - t)
        return r

    ck._ctx.save = timed
    ck.save(1)
    ck.wait()
    regions = len(ck._entries)
    total, c_call[:] = [], []
    prof = cProfile.Profile() if args.profile else None
    for s in range(2, 2 + args.saves):
        if prof:
            prof.enable()
        t = time.perf_counter()
        ck.save(s)
        total.append(time.perf_counter() - t)
        if prof:
            prof.disable()
        ck.wait()
    py = [a - b for a, b in zip(total, c_call)]
    med = statistics.median
    print(f"regions {regions}, relayouts {ck.relayouts}, {args.saves} saves: save() median {med(total) * 1e3:.3f} ms "
          f"(p90 {sorted(total)[int(0.9 * len(total))] * 1e3:.3f}), snap_save C call {med(c_call) * 1e3:.3f} ms, "
          f"save() without it {med(py) * 1e3:.3f} ms (min {min(py) * 1e3:.3f})")
    ck.close()
    if prof:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
finally:
    smp.send_signal(signal.SIGTERM)
    try:
        smp.wait(30)
    except subprocess.TimeoutExpired:
        smp.kill()
        smp.wait()
    shutil.rmtree(store, ignore_errors=True)
