#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""One rank of the optimizer matrix (tests/python/optim_matrix.py): real
training over gloo of a small model for each case in turn, each with its own
optimizer (every torch.optim class, ZeroRedundancyOptimizer over AdamW and
over Adam with two param groups and parameters_as_bucket_view, a
DistributedDataParallel wrapper), an LR scheduler (StepLR or LambdaLR) and a
GradScaler (disabled on CPU, as torch makes it, and still saved), with dropout
and noise from torch's, numpy's and Python's generators, so a generator not
restored changes the loss.

A case is seeded when it starts, so cases do not depend on one another; with
--libsnap each has a Checkpointer of its own (job "<prefix>-<case>"), saves
every step, waits for the commit on odd steps (even steps leave the copy in
flight across the next step) and, relaunched, resumes where its newest step
left it; a case already at its last step is skipped.

Log lines: "start C", "restored C S|none", "digest C S HEX" (the full state
right before save(S), or right after restore returned S), "step C S LOSSHEX",
"t C S T" (CLOCK_MONOTONIC after save(S)), "committed C S",
"held C S" (--hold), "done C". The digest covers model.state_dict(), the
optimizer's own state_dict() (for ZeRO: its local optimizer's, and on rank 0
the consolidated ZeroRedundancyOptimizer.state_dict()), the scheduler's and
the scaler's state_dict(), and the torch, numpy and random generators.
At the last step of the zero, zerogroups, ddp and lbfgs cases it writes what
optim_matrix.py compares load_state_dict with (torch.save, --out).
"""
import argparse
import hashlib
import os
import random
import signal
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

CASES = ["sgd", "adam", "adamw", "adagrad", "rmsprop", "adadelta", "adamax", "nadam", "radam", "asgd",
         "sparseadam", "rprop", "lbfgs", "zero", "ddp", "zerogroups"]

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--cases", default=",".join(CASES))
ap.add_argument("--log", required=True)
ap.add_argument("--out", default=None, help="directory for the final state of the zero and ddp cases")
ap.add_argument("--libsnap", action="store_true")
ap.add_argument("--job-prefix", default="mx")
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--hold", default="", help="CASE:STEP: after committing that step, log 'held' and stop "
                "(SIGSTOP) until the driver continues the rank, so its kill lands in the next step")
args = ap.parse_args()

log = open(args.log, "a", buffering=1)


def say(*a):
    log.write(" ".join(str(x) for x in a) + "\n")


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if args.libsnap:
    import libsnap.torch


def feed(h, x):
    """A digest of nested state: tensors by dtype, shape and bytes."""
    if torch.is_tensor(x):
        t = x.detach().cpu()
        if t.is_sparse:
            t = t.to_dense()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
    elif isinstance(x, np.ndarray):
        h.update(f"A{x.dtype}{x.shape}".encode() + x.tobytes())
    elif isinstance(x, dict):
        h.update(b"{")
        for k, v in x.items():
            feed(h, k)
            feed(h, v)
        h.update(b"}")
    elif isinstance(x, (list, tuple)):
        h.update(b"[")
        for v in x:
            feed(h, v)
        h.update(b"]")
    elif isinstance(x, float):
        h.update(b"f" + x.hex().encode())
    else:
        h.update(f"{type(x).__name__}:{x!r}".encode())


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(12, 24), nn.Linear(24, 6)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.l2(self.drop(torch.tanh(self.l1(x))))


class Bag(nn.Module):
    """Sparse gradients, for SparseAdam."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 6, sparse=True)

    def forward(self, idx):
        return self.emb(idx).sum(1)


def build(case):
    model = Bag() if case == "sparseadam" else MLP()
    wrapped = DDP(model) if case in ("zero", "ddp", "zerogroups") else model
    p = wrapped.parameters()
    opt = {"sgd": lambda: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
           "adam": lambda: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
           "adamw": lambda: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05),
           "adagrad": lambda: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01),
           "rmsprop": lambda: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
           "adadelta": lambda: torch.optim.Adadelta(p, lr=1.0),
           "adamax": lambda: torch.optim.Adamax(p, lr=1e-2),
           "nadam": lambda: torch.optim.NAdam(p, lr=1e-2),
           "radam": lambda: torch.optim.RAdam(p, lr=1e-2),
           "asgd": lambda: torch.optim.ASGD(p, lr=0.05, t0=3),
           "sparseadam": lambda: torch.optim.SparseAdam(list(p), lr=1e-2),
           "rprop": lambda: torch.optim.Rprop(p, lr=1e-2),
           "lbfgs": lambda: torch.optim.LBFGS(p, lr=0.5, max_iter=3, history_size=4),
           "zero": lambda: ZeroRedundancyOptimizer(p, optimizer_class=torch.optim.AdamW, lr=1e-2),
           "ddp": lambda: torch.optim.AdamW(p, lr=1e-2),
           # two param groups, parameters as views into ZeRO's buckets
           "zerogroups": lambda: ZeroRedundancyOptimizer(
               [{"params": list(model.l1.parameters())}, {"params": list(model.l2.parameters()), "lr": 5e-3}],
               optimizer_class=torch.optim.Adam, parameters_as_bucket_view=True, lr=1e-2, amsgrad=True)}[case]()
    if CASES.index(case) % 2:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.1 * s))
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "CUDA is not available. Disabling": torch's CPU behaviour
        scaler = torch.cuda.amp.GradScaler()
    return model, wrapped, opt, sched, scaler


def digest(case, wrapped, opt, sched, scaler):
    h = hashlib.sha256()
    feed(h, wrapped.state_dict())
    if isinstance(opt, ZeroRedundancyOptimizer):
        # collective; first, as it syncs the exposed param_groups (an LR
        # scheduler's lr) into the local optimizer's, which save() then holds
        opt.consolidate_state_dict(to=0)
        feed(h, opt.optim.state_dict())
        if rank == 0:
            feed(h, opt.state_dict())
    else:
        feed(h, opt.state_dict())
    feed(h, sched.state_dict())
    feed(h, scaler.state_dict())
    feed(h, torch.get_rng_state())
    feed(h, np.random.get_state())
    feed(h, random.getstate())
    return h.hexdigest()[:32]


def batch(case):
    if case == "sparseadam":
        x = torch.randint(0, 40, (8, 5))
    else:
        x = torch.randn(8, 12)
        x = x + torch.from_numpy(np.random.standard_normal((8, 12)).astype(np.float32)) * (0.01 * random.random())
    y = torch.randint(0, 6, (8,))
    return x, y


def reduce_grads(model):
    for p in model.parameters():
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            g = p.grad.to_dense()
            dist.all_reduce(g)
            p.grad = (g / world).to_sparse()
        else:
            dist.all_reduce(p.grad)
            p.grad /= world


def run(case):
    seed = args.seed + 1000 * rank + 17 * CASES.index(case)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model, wrapped, opt, sched, scaler = build(case)
    ckpt, start = None, 1
    if args.libsnap:
        ckpt = libsnap.torch.Checkpointer(wrapped, opt, extra={"sched": sched, "scaler": scaler},
                                          job=f"{args.job_prefix}-{case}")
        if ckpt.latest() == args.steps:
            ckpt.close()
            say("done", case)
            return
        say("start", case)
        got = ckpt.restore()
        say("restored", case, "none" if got is None else got)
        if got is None:
            ckpt.save(0)
            ckpt.wait()
        else:
            say("digest", case, got, digest(case, wrapped, opt, sched, scaler))
            start = got + 1
    else:
        say("start", case)
    for step in range(start, args.steps + 1):
        x, y = batch(case)
        wrapped.train()

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(wrapped(x), y)
            scaler.scale(loss).backward()
            if case not in ("zero", "ddp", "zerogroups"):
                reduce_grads(model)
            return loss
        if case == "lbfgs":
            loss = scaler.step(opt, closure)
        else:
            loss = closure()
            scaler.step(opt)
        scaler.update()
        sched.step()
        say("step", case, step, loss.item().hex())
        say("digest", case, step, digest(case, wrapped, opt, sched, scaler))
        if ckpt is not None:
            ckpt.save(step)
        say("t", case, step, f"{time.monotonic():.6f}")
        if ckpt is not None:
            if step % 2:
                ckpt.wait()
                say("committed", case, step)
                if args.hold == f"{case}:{step}":
                    say("held", case, step)
                    os.kill(os.getpid(), signal.SIGSTOP)
    if args.out and case in ("zero", "ddp", "lbfgs", "zerogroups"):
        final = {"model": wrapped.state_dict()}
        if case.startswith("zero"):
            final["local"] = opt.optim.state_dict()
            opt.consolidate_state_dict(to=0)
            if rank == 0:
                final["consolidated"] = opt.state_dict()
        else:
            final["optimizer"] = opt.state_dict()
        torch.save(final, os.path.join(args.out, f"{case}-rank{rank}.pt"))
    if ckpt is not None:
        ckpt.close()
        say("committed", case, args.steps)
    say("done", case)


for c in args.cases.split(","):
    run(c)
dist.barrier()
say("all-done")
log.close()
sys.exit(0)
