#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch with torch's ZeroRedundancyOptimizer against plain AdamW on
the same model, RANKS processes over gloo, through a private snapsmp; and
the generic path (optimizer_state="state_dict": the optimizer's own
state_dict() pickled at each save) on plain AdamW, which is what an
optimizer without a zero-copy path costs.

Per rank, medians over the measured steps of a real training step (MLP of
--layers x --width, forward, backward, gradients all-reduced or DDP, the
optimizer's step), saving every step:

  snapshot   bytes one rank's snapshot holds (model + its optimizer state)
  save       what save() takes before it returns (the copy is queued)
  fence      what the next optimizer.step() waits for that copy
  stall      save + fence: what saving adds to the step on this rank
  commit     save() -> committed by snapsmp, waited for at once (every
             other step; the steps between measure the fence)
  step       the training step without libsnap, for scale

usage: bench_torch_zero.py [--build BUILD] [--width 1024] [--layers 8] [--steps 14] [--ranks 2] [--json]
The first 4 steps (slots mapped and populated, Adam's state created) are
left out.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.abspath(os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(src, "integration", "python"))
sys.path.insert(0, os.path.join(src, "tests", "fault"))

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(src, "build", "gcc"))
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--json", action="store_true")
ap.add_argument("--rank-mode", default=None, help=argparse.SUPPRESS)
ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
args = ap.parse_args()
SKIP = 4
MODES = ["adamw", "zero", "adamw-state_dict"]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rank_main(mode):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    model = DDP(nn.Sequential(*layers))
    if mode == "zero":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, args.width)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    plain = []
    for i in range(SKIP + 3):
        t = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t)
    res = {"step": med(plain[SKIP:])}
    if mode != "none":
        import libsnap.torch as lt
        ck = lt.Checkpointer(model, opt, job=f"bench-{mode}",
                             optimizer_state="state_dict" if mode.endswith("state_dict") else None)
        fences, saves, commits = [], [], []
        real_fence = ck.fence

        def timed_fence():
            t = time.perf_counter()
            real_fence()
            fences[-1] = time.perf_counter() - t

        ck.fence = timed_fence
        for s in range(1, args.steps + 1):
            fences.append(0.0)
            step()
            dist.barrier()   # ranks save together, as a synchronous job does
            t = time.perf_counter()
            ck.save(s)
            saves.append(time.perf_counter() - t)
            if s % 2 == 0:
                ck.wait()
                commits.append((s, time.perf_counter() - t))
        # fences[i] is step i+1's, which waits for the save of step i: the
        # odd steps' saves are not waited for
        fence_after_async = [fences[i] for i in range(len(fences)) if i % 2 == 1 and i >= SKIP]
        res.update(save=med(saves[SKIP:]), fence=med(fence_after_async),
                   commit=med([c for s, c in commits if s > SKIP]),
                   bytes=sum(e.ptr_bytes()[1] for e in ck._entries), relayouts=ck.relayouts)
        ck.close()
    with open(args.out, "w") as f:
        json.dump(res, f)
    dist.barrier()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    from events import wait_socket
    store = f"/dev/shm/snapbench-torchzero-{os.getpid()}"
    outdir = os.path.join(args.build, f"bench-torch-zero-{os.getpid()}")
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(outdir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    smp = subprocess.Popen([os.path.join(args.build, "smp", "snapsmp"), "--store", store, "--quiet"], env=env)
    wait_socket(store, smp)
    lib = os.path.join(args.build, "libsnap", "libsnap.so")
    results = {}
    try:
        for mode in MODES:
            port = free_port()
            procs = []
            for r in range(args.ranks):
                e = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                         WORLD_SIZE=str(args.ranks), SNAP_STORE=store, SNAP_LIBRARY=lib, OMP_NUM_THREADS="1",
                         PYTHONPATH=os.path.join(src, "integration", "python"))
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-mode", mode,
                                               "--out", os.path.join(outdir, f"{mode}-{r}.json"),
                                               "--width", str(args.width), "--layers", str(args.layers),
                                               "--steps", str(args.steps)], env=e))
            if any(p.wait() != 0 for p in procs):
                print(f"{mode}: a rank failed")
                return 1
            results[mode] = [json.load(open(os.path.join(outdir, f"{mode}-{r}.json"))) for r in range(args.ranks)]
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"width": args.width, "layers": args.layers, "ranks": args.ranks, "results": results}))
        return 0
    print(f"{args.ranks} ranks, MLP {args.layers} x {args.width} (AdamW), medians per rank, ms")
    print(f"{'mode':18} {'rank':>4} {'snapshot MB':>11} {'save':>7} {'fence':>7} {'stall':>7} {'commit':>7} "
          f"{'step':>7}")
    for mode, rs in results.items():
        for r, x in enumerate(rs):
            print(f"{mode:18} {r:4d} {x['bytes'] / 1e6:11.1f} {x['save'] * 1e3:7.2f} {x['fence'] * 1e3:7.2f} "
                  f"{(x['save'] + x['fence']) * 1e3:7.2f} {x['commit'] * 1e3:7.1f} {x['step'] * 1e3:7.1f}")
    return 0


if __name__ == "__main__":
    if args.rank_mode:
        rank_main(args.rank_mode)
        sys.exit(0)
    sys.exit(main())
