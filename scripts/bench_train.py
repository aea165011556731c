#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpointing inside a real training loop: what it costs the step, and how
fast training runs again after a kill.

A GPT-style decoder defined here (no downloads; sized by --preset or
--layers/--d-model/--heads/--seq/--batch/--vocab) is trained with AdamW on a
fixed, seeded synthetic token stream (the batch of step s depends on s alone),
optionally under bf16 autocast. The same N steps run in each mode:

  base           no checkpointing (run first and again last: the noise floor)
  snap@K         libsnap.torch Checkpointer.save every K steps (K = 1, 10)
  snap-lossless@K  the same with the lossless float codec on params and Adam state
  snap-tN@K      (and snap-lossless-tN@K) with N copy threads (SNAP_COPY_THREADS)
  dcp@K          torch.distributed.checkpoint.async_save to /dev/shm every K
                 steps, the previous save awaited first (skipped, saying why,
                 where this torch has no async_save)
  torch@10       torch.save of {model, optimizer} state_dicts to /dev/shm

Each mode reports the median step time and its spread (p10/p90), the mean
step time and its overhead over the baseline's mean (a save every K steps
shows in the mean, not the median), the host stall per save (time inside
the save call, for DCP including the wait for the previous save), the
save -> committed time (separate probes on an idle GPU: save, then wait for
the commit), the smallest interval K at which the save would cost < 1% of
the step (per-save cost = (mean - base mean) * K), the host memory (peak
RSS from VmHWM, reset per mode; pinned bytes: snap_pinned for libsnap, the
CUDA caching host allocator's peak for torch), the GPU memory added (peak
allocated over the baseline's, and the driver-level used delta, which sees
allocations outside torch's allocator) and the bytes on /dev/shm.

`recover` kills a trainer (this file, `train`) with SIGKILL right after a
random committed step, relaunches it, and times launch -> state restored ->
first step done, from libsnap's node store, DCP's directory and torch.save's
file. The trainer then uses deterministic kernels and plain attention, and
the losses of every step after the resume must equal an uninterrupted run's
bit for bit.

usage:
  bench_train.py bench   [--preset 124m] [--device cuda] [--steps 40] [--modes ...] --store DIR [--snapsmp BIN] --json OUT
  bench_train.py recover [--preset 124m] [--device cuda] [--steps 20] --store DIR [--snapsmp BIN] --json OUT
Give --snapsmp to start a snapsmp (own process session) on --store with
--mem-limit (default: 3 states + 1 GiB) and stop it at the end; without it a
snapsmp must already serve --store. libsnap.torch comes from PYTHONPATH
(integration/python), libsnap.so from SNAP_LIBRARY or beside it.

The parts live in benchtrain/ beside this file: model (the GPT, data,
optimizer, step), measure (memory, pinned bytes, copy speed), savers (one
per checkpointing kind), modes (`bench`), report (JSON, table), recovery
(`recover` and its trainer). Copy the folder with this file
(scripts/bench_train_pack.sh lays out everything a GPU node needs).

Untested on a GPU: run there (NVIDIA H200, torch 2.11) were the 124m's
base, snap@1, snap@10, snap-lossless@10, dcp@10, torch@10, the recovery
trials of all three kinds, and the 1.3b's base, dcp@10 and torch@10. Never
run on a GPU: the snap-tN modes, snap-lossless@1, dcp@1, every libsnap mode
at 1.3b, `recover --copy-threads`, and this split of the script into
benchtrain/ (its CPU paths run in CI: tests/python/bench_train_smoke.py).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchtrain.model import ALL_MODES, PRESETS  # noqa: E402
from benchtrain.savers import Skip, dcp_api  # noqa: E402,F401  (tests/python/bench_train_smoke.py uses them)
from benchtrain.modes import bench  # noqa: E402
from benchtrain.recovery import recover, trainer  # noqa: E402


# ---- main -------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["bench", "recover", "train"])
    ap.add_argument("--preset", default="124m", choices=sorted(PRESETS))
    for k in ("layers", "d-model", "heads", "seq", "batch", "vocab"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-amp", dest="amp", action="store_false", help="no bf16 autocast (on the GPU)")
    ap.add_argument("--steps", type=int, default=40, help="measured steps per mode (recover: steps of the run)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--probes", type=int, default=3, help="save -> committed probes after each mode")
    ap.add_argument("--modes", nargs="+", default=ALL_MODES)
    ap.add_argument("--mode-budget-s", type=float, default=0, help="stop a mode's steps after this long (0: never)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--store", default="/dev/shm/bench_train_store")
    ap.add_argument("--shm", default="/dev/shm", help="where DCP and torch.save write")
    ap.add_argument("--snapsmp", help="start this snapsmp on --store (and stop it at the end)")
    ap.add_argument("--mem-limit", help="snapsmp --mem-limit (default: 3 states + 1 GiB)")
    ap.add_argument("--json")
    ap.add_argument("--copy-threads", type=int, help="libsnap copy threads (SNAP_COPY_THREADS; default: the library's)")
    ap.add_argument("--every-other", type=int, default=5, help="recover: save interval for dcp and torch.save")
    # train (recovery trainer) only
    ap.add_argument("--ckpt", default="none", choices=["none", "snap", "dcp", "torch"])
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--ckpt-path")
    ap.add_argument("--job", default="bench_recover")
    args = ap.parse_args()
    os.makedirs(args.shm, exist_ok=True)
    if args.what == "bench":
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
        out = bench(args)
        bad = [r["mode"] for r in out["modes"] if r["status"] == "failed"]
        return 1 if bad else 0
    if args.what == "recover":
        out = recover(args)
        return 1 if out["failures"] else 0
    trainer(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
