#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch against what a PyTorch user would otherwise do, on a model
whose parameters plus AdamW state are 1-2 GB, through a private snapsmp.

  stall      what saving adds to a training step of about 1 s: the save()
             call plus the fence the next optimizer.step() does (waiting
             for the copy), and the step time with saves minus without (the
             copy threads compete with the step for cores and memory). The
             step is a calibrated matmul loop that leaves the model alone:
             a real AdamW step over this model takes 15 s on the 2-core
             development machine, which would hide any stall.
  committed  save() -> committed by snapsmp (copy + CRC32C + commit),
             without training, vs memcpy of the same bytes (torch copy_
             into preallocated tensors), at 1 and 2 threads each
  torch.save the same state_dict to /dev/shm and to disk (+ fsync)

usage: bench_torch.py [--build BUILD] [--width 4096] [--layers 8] [--steps 8]
                      [--disk-dir DIR] [--json]
Medians; the first two saves (which map and populate the slots) are left out
and the first is reported apart.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.abspath(os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(src, "integration", "python"))

import torch  # noqa: E402

import libsnap.torch as lt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(src, "build", "gcc"))
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--disk-dir", default=None, help="directory on disk for torch.save + fsync (default: a temp dir "
                "under the build dir)")
ap.add_argument("--json", action="store_true")
args = ap.parse_args()


def now():
    return time.perf_counter()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    store = f"/dev/shm/snapbench-torch-{os.getpid()}"
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    t = now()
    opt.step()                           # Adam state exists: 3x the parameter bytes
    adam_s = now() - t
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    nbytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    gb = nbytes / 1e9
    smp = subprocess.Popen([os.path.join(args.build, "smp", "snapsmp"), "--store", store, "--quiet",
                            "--mem-limit", str(3 * nbytes + (256 << 20))])
    while not os.path.exists(os.path.join(store, "smp.sock")):
        if smp.poll() is not None:
            sys.exit("snapsmp did not start")
        time.sleep(0.01)
    res = {"bytes": nbytes, "adamw_step_s": adam_s}
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def work(n):
        for _ in range(n):
            torch.mm(a, b)

    torch.set_num_threads(1)
    t = now()
    work(20)
    n = max(1, int(20 / (now() - t)))    # about 1 s of matmuls on one thread
    step = 0
    try:
        # 1. the stall in a loop of ~1 s steps, one copy thread (the other core is the copy's)
        ck = lt.Checkpointer(model, opt, job="bench", store=store, copy_threads=1)
        t = now()
        ck.save(step)
        ck.wait()
        res["first_commit_s"] = now() - t
        base, withs, saves, fences = [], [], [], []
        for i in range(args.steps + 2):
            t0 = now()
            work(n)
            base.append(now() - t0)
        for i in range(args.steps + 2):
            step += 1
            t0 = now()
            work(n)
            t = now()
            ck.fence()                  # what optimizer.step() does first
            fences.append(now() - t)
            t = now()
            ck.save(step)
            saves.append(now() - t)
            withs.append(now() - t0)
        ck.wait()
        res.update(step_without_s=med(base[2:]), step_with_s=med(withs[2:]), save_call_s=med(saves[2:]),
                   fence_s=med(fences[2:]))
        res["stall_s"] = res["save_call_s"] + res["fence_s"]
        # 2. save -> committed vs memcpy, 1 and 2 threads
        srcs = [p.data for p in model.parameters()] + \
            [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
        dsts = [torch.empty_like(t) for t in srcs]
        for threads in (1, 2):
            if threads != 1:
                ck.close()
                ck = lt.Checkpointer(model, opt, job="bench", store=store, copy_threads=threads)
            commits = []
            for i in range(args.steps + 2):
                step += 1
                t = now()
                ck.save(step)
                ck.wait()
                commits.append(now() - t)
            torch.set_num_threads(threads)
            copies = []
            for i in range(args.steps + 1):
                t = now()
                for d, s_ in zip(dsts, srcs):
                    d.copy_(s_)
                copies.append(now() - t)
            res[f"commit_{threads}t_s"] = med(commits[2:])
            res[f"memcpy_{threads}t_s"] = med(copies[1:])
        ck.close()
        del dsts
        torch.set_num_threads(1)
        # 3. torch.save of the same state
        sd = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        disk = args.disk_dir or tempfile.mkdtemp(prefix="bench-torch-", dir=args.build)
        for where, d in (("shm", "/dev/shm"), ("disk", disk)):
            times = []
            path = os.path.join(d, f"bench-torch-{os.getpid()}.pt")
            for _ in range(3):
                t = now()
                with open(path, "wb") as f:
                    torch.save(sd, f)
                    if where == "disk":
                        f.flush()
                        os.fsync(f.fileno())
                times.append(now() - t)
                os.unlink(path)
            res[f"torch_save_{where}_s"] = med(times)
        if not args.disk_dir:
            shutil.rmtree(disk, ignore_errors=True)
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)

    res["stall_share"] = res["stall_s"] / res["step_without_s"]
    res["slowdown_share"] = res["step_with_s"] / res["step_without_s"] - 1
    for th in (1, 2):
        res[f"commit_vs_memcpy_{th}t"] = res[f"commit_{th}t_s"] / res[f"memcpy_{th}t_s"]
    best = min(res["commit_1t_s"], res["commit_2t_s"])
    res["torch_save_shm_vs_commit"] = res["torch_save_shm_s"] / best
    res["torch_save_disk_vs_commit"] = res["torch_save_disk_s"] / best
    if args.json:
        print(json.dumps(res, indent=1))
        return
    r = res
    print(f"model: {args.layers} x Linear({args.width}, {args.width}) + AdamW state = {gb:.2f} GB "
          f"(a real AdamW step over it: {r['adamw_step_s']:.1f} s here); medians of {args.steps}")
    print(f"stall, steps of {r['step_without_s']:.2f} s (matmuls, 1 thread), 1 copy thread:")
    print(f"  save() call                       {r['save_call_s'] * 1e3:.2f} ms")
    print(f"  fence before the optimizer step   {r['fence_s'] * 1e3:.2f} ms")
    print(f"  stall = save + fence              {r['stall_s'] * 1e3:.2f} ms = {r['stall_share'] * 100:.2f}% of the "
          "step (target < 1%)")
    print(f"  step with saves vs without        {r['step_with_s']:.3f} s vs {r['step_without_s']:.3f} s "
          f"({r['slowdown_share'] * 100:+.1f}%)")
    print("save -> committed vs memcpy (torch copy_ into preallocated tensors) of the same bytes:")
    for th in (1, 2):
        print(f"  {th} thread(s): committed {r[f'commit_{th}t_s']:.3f} s ({gb / r[f'commit_{th}t_s']:.2f} GB/s), "
              f"memcpy {r[f'memcpy_{th}t_s']:.3f} s ({gb / r[f'memcpy_{th}t_s']:.2f} GB/s): "
              f"{r[f'commit_vs_memcpy_{th}t']:.2f}x (target <= 1.5x)")
    print(f"  torch.save to /dev/shm            {r['torch_save_shm_s']:.3f} s: committed is "
          f"{r['torch_save_shm_vs_commit']:.1f}x faster (target >= 5x)")
    print(f"  torch.save to disk + fsync        {r['torch_save_disk_s']:.3f} s: committed is "
          f"{r['torch_save_disk_vs_commit']:.1f}x faster")
    print(f"  first save -> committed           {r['first_commit_s']:.3f} s (registers, maps and populates the slots)")


if __name__ == "__main__":
    main()
