#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""An ordinary PyTorch training script that knows nothing of libsnap: it
checkpoints with torch.save to a temporary name and os.replace, keeps the
newest two checkpoints (os.remove), and on start resumes from the newest one
it finds with os.listdir and torch.load. The preload tests run it under
LD_PRELOAD=libsnap_preload.so and SIGKILL it.

    torch_train.py DIR STEPS EVERY

Prints "resumed S", "loss STEP HEX" per step (float.hex: compared bit for
bit), "saving S" / "saved S" around each checkpoint, "done".

The model starts from real trained weights (the PP-OCRv4 recognizer's
float32 tensors: $SNAP_TEST_WEIGHTS, default the 1 MiB sample in tests/data,
repeated to the model's size, clamped to [-1, 1] and scaled so a tanh MLP
trains); the data of step s comes from a
generator seeded with s, and dropout draws from the global RNG, whose
state is checkpointed, so an interrupted run that resumes must reproduce
an uninterrupted one exactly.
"""
import os
import sys

import numpy as np
import torch
from torch import nn

WEIGHTS = os.environ.get("SNAP_TEST_WEIGHTS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "data", "ppocr_v4_rec_1mib.f32")


def main():
    ckdir, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.Tanh(), nn.Dropout(0.1), nn.Linear(2048, 512))
    # The weights ship with the repository: missing, np.fromfile fails loudly.
    w = np.resize(np.fromfile(WEIGHTS, dtype="<f4"), sum(p.numel() for p in model.parameters()))
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(w[off:off + n].copy()).reshape(p.shape).clamp(-1, 1) * 0.05)
            off += n
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 0
    names = [n for n in os.listdir(ckdir) if n.startswith("ckpt-") and n.endswith(".pt")]
    if names:
        newest = max(names, key=lambda n: int(n[5:-3]))
        state = torch.load(os.path.join(ckdir, newest))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
    print(f"resumed {start}", flush=True)
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(64, 512, generator=g)
        y = torch.sin(x * 3)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {step} {loss.item().hex()}", flush=True)
        if (step + 1) % every == 0:
            print(f"saving {step + 1}", flush=True)
            tmp = os.path.join(ckdir, "tmp.pt")
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step + 1}, tmp)
            os.replace(tmp, os.path.join(ckdir, f"ckpt-{step + 1}.pt"))
            for n in os.listdir(ckdir):
                if n.startswith("ckpt-") and n.endswith(".pt") and int(n[5:-3]) <= step + 1 - 2 * every:
                    os.remove(os.path.join(ckdir, n))
            print(f"saved {step + 1}", flush=True)
    print("done", flush=True)


main()
