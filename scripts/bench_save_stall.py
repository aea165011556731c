#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Host stall of libsnap.torch's Checkpointer.save() on the CPU: the Python
side of a save (building or reusing the plan, filling payloads) apart from
the snap_save C call itself, on a 12-layer stack of Linear/LayerNorm with
AdamW after its first step (146 parameters, 588 regions). A snapsmp it starts serves
the saves; each save is waited for (outside the timing) before the next.

usage: bench_save_stall.py --snapsmp BIN [--saves 100] [--layers 12] [--width 256] [--step] [--profile]
                           [--json FILE --label NAME]
"""
import argparse
import cProfile
import json
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
ap.add_argument("--step", action="store_true", help="an AdamW step (the gradients kept) after each save's commit, "
                "before the next save, as in a training loop; without it the save follows the commit's copy")
ap.add_argument("--json", help="append the figures to this file as one JSON line")
ap.add_argument("--label", default="", help="a name for this run in the JSON line")
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
    parts = {"plan": [], "layout": [], "state_dict": []}

    def timing(obj, attr, into):
        real_f = getattr(obj, attr)

        def f(*a, **k):
            t = time.perf_counter()
            r = real_f(*a, **k)
            into.append(time.perf_counter() - t)
            return r
        setattr(obj, attr, f)

    timing(ck, "_plan", parts["plan"])
    timing(ck, "_layout", parts["layout"])
    # the model's state_dict: through the cache where the package has one
    if hasattr(ck, "_model_state"):
        timing(ck._model_state, "get", parts["state_dict"])
    else:
        timing(ck._model, "state_dict", parts["state_dict"])
    ck.save(1)
    ck.wait()
    regions = len(ck._entries)
    total, c_call[:] = [], []
    for v in parts.values():
        v.clear()
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
        if args.step:
            opt.step()   # as in training: the step reads every tensor just before the save
    py = [a - b for a, b in zip(total, c_call)]
    med = statistics.median
    # the same plan repeated with no copy in between: CPU caches warm
    warm = []
    for _ in range(args.saves):
        t = time.perf_counter()
        ck._plan()
        warm.append(time.perf_counter() - t)

    def q(xs, f):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(f * len(xs)))] * 1e3

    res = {"step": args.step, "layers": args.layers, "width": args.width, "regions": regions, "relayouts": ck.relayouts,
           "saves": args.saves, "save_ms": med(total) * 1e3, "save_p10_ms": q(total, 0.1),
           "save_p90_ms": q(total, 0.9), "c_call_ms": med(c_call) * 1e3, "c_call_p90_ms": q(c_call, 0.9),
           "warm_plan_ms": med(warm) * 1e3, "python_ms": med(py) * 1e3, "python_min_ms": min(py) * 1e3, "python_p90_ms": q(py, 0.9)}
    for k, v in parts.items():
        if v:
            res[k + "_ms"] = med(v) * 1e3
    print(f"regions {regions}, relayouts {ck.relayouts}, {args.saves} saves: save() median {res['save_ms']:.3f} ms "
          f"(p10 {res['save_p10_ms']:.3f}, p90 {res['save_p90_ms']:.3f}), snap_save C call {res['c_call_ms']:.3f} ms "
          f"(p90 {res['c_call_p90_ms']:.3f}), save() without it {res['python_ms']:.3f} ms (min "
          f"{res['python_min_ms']:.3f}, p90 {res['python_p90_ms']:.3f}); of which _plan "
          f"{res.get('plan_ms', 0):.3f}, _layout {res.get('layout_ms', 0):.3f}, model.state_dict "
          f"{res.get('state_dict_ms', 0):.3f} ms; _plan repeated warm {res['warm_plan_ms']:.3f} ms")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(dict(res, label=args.label)) + "\n")
    ck.close()
    if prof:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
finally:
    smp.send_signal(signal.SIGTERM)
    try:
        smp.wait(30)
    except subprocess.TimeoutExpired:
        smp.kill()
        smp.wait()
    shutil.rmtree(store, ignore_errors=True)
