#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A small real training job for the libsnap.torch tests: a byte-level
transformer language model (embeddings, 2 encoder layers with dropout, causal
mask) trained with AdamW and a StepLR schedule on real text, data parallel
over gloo (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the environment,
gradients all-reduced). Each rank draws its batches from torch's RNG and adds
noise from numpy's and Python's `random`, so a mis-restored generator changes
the loss.

Without --libsnap it never imports libsnap (the reference run). With it, a
Checkpointer saves every step (waiting for the commit on odd steps only, so
even steps leave the copy in flight during the next forward/backward and rely
on the fence in optimizer.step), and a relaunch resumes from the newest
restorable step.

Log lines (one per event, flushed at once; tests/python/train_trials.py
reads them): restore-begin, restored <step|none>, step <s> <loss float.hex>,
save-begin <s>, saved <s> (save returned), committed <s>, relayouts <n>, done;
with TRAIN_PAUSE_AT=a,b,... also "paused <s>" after committing those (odd)
steps, and the rank stops itself (SIGSTOP) until continued. A restore that does not
fit prints "MISMATCH <message>" and exits 3.
"""
import argparse
import gc
import os
import random
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--data", nargs="+", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--libsnap", action="store_true")
ap.add_argument("--d-model", type=int, default=32)
ap.add_argument("--optim", default="adamw", choices=["adamw", "sgd"])
ap.add_argument("--seq", type=int, default=32)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seed", type=int, default=1234)
ap.add_argument("--device", default="cpu", help="cuda: model, optimizer state and batches on the GPU")
ap.add_argument("--no-history", action="store_true", help="keep no per-step history (check_memory_torch.py: "
                "this process's own memory then stays flat)")
args = ap.parse_args()
dev = torch.device(args.device)
if dev.type == "cuda":
    # Bit-identical losses across a resume need deterministic kernels
    # (the embedding's backward, cuBLAS's reductions).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)

# "%r" in --log: one log per rank when a launcher passes every rank the same
# arguments (torchrun).
log = open(args.log.replace("%r", os.environ.get("RANK", "0")), "a", buffering=1)


def say(*a):
    log.write(" ".join(str(x) for x in a) + "\n")


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
seed = args.seed + 1000 * rank
torch.manual_seed(seed)
np.random.seed(seed)
random.seed(seed)

text = b"".join(open(p, "rb").read() for p in args.data)
data = torch.tensor(list(text), dtype=torch.long)


class LM(nn.Module):
    def __init__(self, d, seq):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = lambda: nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.1, batch_first=True)
        self.layers = nn.ModuleList([layer(), layer()])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)

    def forward(self, x, noise):
        h = self.tok(x) + self.pos[: x.shape[1]] + noise
        mask = torch.triu(torch.full((x.shape[1], x.shape[1]), float("-inf"), device=x.device), 1)
        for l in self.layers:
            h = l(h, src_mask=mask)
        return self.head(self.norm(h))


model = LM(args.d_model, args.seq).to(dev)
if args.optim == "adamw":
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.7)
history = []   # grows every step: its pickled region outgrows its room now and then

ckpt, start = None, 1
if args.libsnap:
    import libsnap.torch

    ckpt = libsnap.torch.Checkpointer(model, opt, extra={"sched": sched, "history": history, "tokens": 0},
                                      job=os.environ.get("SNAP_JOB", "pytrain"))
    say("restore-begin")
    try:
        got = ckpt.restore()
    except libsnap.MismatchError as e:
        say("MISMATCH", e)
        print(f"rank {rank}: {e}", file=sys.stderr)
        log.close()
        os._exit(3)
    say("restored", "none" if got is None else got)
    if got is None:
        ckpt.save(0)          # the initial state (no optimizer state yet: step 1 changes the layout)
        ckpt.wait()
    else:
        start = got + 1
        history = ckpt.extra["history"]

for step in range(start, args.steps + 1):
    starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,))
    x = torch.stack([data[s:s + args.seq] for s in starts])
    y = torch.stack([data[s + 1:s + args.seq + 1] for s in starts])
    noise = torch.from_numpy(np.random.standard_normal((args.batch, args.seq, args.d_model)).astype(np.float32))
    noise = noise * (0.01 * (0.5 + random.random()))
    x, y, noise = x.to(dev), y.to(dev), noise.to(dev)
    model.train()
    loss = F.cross_entropy(model(x, noise).reshape(-1, 256), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    sched.step()
    say("step", step, loss.item().hex())
    if not args.no_history:
        history.append((step, loss.item(), sched.get_last_lr()[0], [p.grad.norm().item() for p in model.parameters()]))
    if ckpt is not None:
        ckpt.extra["history"] = history
        ckpt.extra["tokens"] = step * args.batch * args.seq
        say("save-begin", step)
        ckpt.save(step)
        say("saved", step)
        if step % 2:
            ckpt.wait()
            say("committed", step)
            if str(step) in os.environ.get("TRAIN_PAUSE_AT", "").split(","):
                # check_memory_torch.py reads /proc while this rank is stopped
                # between steps, the save committed.
                gc.collect()   # cyclic garbage (StepLR makes a class per step) is not a leak
                say("paused", step)
                os.kill(os.getpid(), signal.SIGSTOP)
        say("relayouts", ckpt.relayouts)
if ckpt is not None:
    ckpt.close()              # waits for the last commit
    if start <= args.steps:
        say("committed", args.steps)
dist.barrier()
say("done")
log.close()
