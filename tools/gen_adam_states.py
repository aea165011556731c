#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Produce real Adam optimizer states for the codec benchmark.

Trains a small CNN on generated data (a learnable synthetic task: classify
noisy oriented-stripe images) for a few hundred Adam steps on the CPU, then
writes exp_avg and exp_avg_sq of every parameter, concatenated in parameter
order, as raw little-endian float32:

    /usr/bin/python3 tools/gen_adam_states.py OUTDIR [--steps 300] [--seed 0]

writes OUTDIR/adam_exp_avg.f32, OUTDIR/adam_exp_avg_sq.f32 and
OUTDIR/weights.f32 (the trained parameters). Runs in well under a minute.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn


def batch(gen, n):
    """Noisy stripe images; the label is the stripe orientation (4 classes)."""
    y = torch.randint(0, 4, (n,), generator=gen)
    xs = torch.arange(16.0)
    gy, gx = torch.meshgrid(xs, xs, indexing="ij")
    ang = y.float() * (np.pi / 4)
    phase = torch.rand(n, generator=gen) * 6.28
    proj = gx[None] * torch.cos(ang)[:, None, None] + gy[None] * torch.sin(ang)[:, None, None]
    img = torch.sin(proj * 0.8 + phase[:, None, None])
    img = img + 2.0 * torch.randn(n, 16, 16, generator=gen)
    flip = torch.rand(n, generator=gen) < 0.1  # label noise keeps gradients alive
    y = torch.where(flip, torch.randint(0, 4, (n,), generator=gen), y)
    return img[:, None], y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(a.seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    for step in range(a.steps):
        x, y = batch(gen, 32)
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == a.steps - 1:
            acc = (model(x).argmax(1) == y).float().mean().item()
            print(f"step {step:4d} loss {loss.item():.4f} acc {acc:.2f}")
    os.makedirs(a.outdir, exist_ok=True)
    params = list(model.parameters())
    m = torch.cat([opt.state[p]["exp_avg"].flatten() for p in params])
    v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in params])
    w = torch.cat([p.detach().flatten() for p in params])
    for name, t in (("adam_exp_avg", m), ("adam_exp_avg_sq", v), ("weights", w)):
        path = os.path.join(a.outdir, name + ".f32")
        t.numpy().astype("<f4").tofile(path)
        print(f"{path}: {t.numel()} values, range [{t.min().item():.3g}, {t.max().item():.3g}]")


if __name__ == "__main__":
    main()
