# SPDX-License-Identifier: BSD-3-Clause
"""The GPT-style decoder, its fixed data stream, its optimizer and one
training step; the presets and mode names."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F



PRESETS = {
    "tiny": dict(layers=2, d_model=64, heads=4, seq=64, batch=4, vocab=512),
    "124m": dict(layers=12, d_model=768, heads=12, seq=1024, batch=8, vocab=50304),
    "350m": dict(layers=24, d_model=1024, heads=16, seq=1024, batch=8, vocab=50304),
    "760m": dict(layers=24, d_model=1536, heads=16, seq=1024, batch=8, vocab=50304),
    "1.3b": dict(layers=24, d_model=2048, heads=16, seq=1024, batch=8, vocab=50304),
}
ALL_MODES = ["base", "snap@1", "snap@10", "snap-lossless@1", "snap-lossless@10", "dcp@10", "dcp@1", "torch@10",
             "base2"]
JOB = "bench_train"


# ---- the model ------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # plain attention: deterministic kernels only (the recovery check)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Decoder-only LM (GPT-2 layout, untied head). No buffers: the forward
    writes no registered memory, so the Checkpointer needs no forward fence."""

    def __init__(self, layers, d_model, heads, seq, vocab, sdpa):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = nn.ModuleList([Block(d_model, heads, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


class Data:
    """A fixed token stream: a seeded random text of 4096 tokens repeated
    with seeded noise (learnable, so the loss falls); the batch of step s is
    drawn with a generator seeded by (seed, s), so a resumed run sees the
    same batches without any data-loader state."""

    def __init__(self, vocab, seq, batch, seed, device):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(vocab, (4096,), generator=g)
        n = max(64 * (seq + 1), 1 << 16)
        stream = base.repeat(n // 4096 + 1)[:n].clone()
        noise = torch.rand(n, generator=g) < 0.1
        stream[noise] = torch.randint(vocab, (int(noise.sum()),), generator=g)
        self.stream, self.seq, self.batch, self.seed, self.device = stream, seq, batch, seed, device

    def __call__(self, step):
        g = torch.Generator().manual_seed(self.seed * 1000003 + step)
        starts = torch.randint(len(self.stream) - self.seq - 1, (self.batch,), generator=g)
        xy = torch.stack([self.stream[s:s + self.seq + 1] for s in starts.tolist()])
        xy = xy.to(self.device, non_blocking=True)
        return xy[:, :-1], xy[:, 1:]


def geometry(args):
    g = dict(PRESETS[args.preset])
    for k in g:
        v = getattr(args, k.replace("-", "_"), None)
        if v is not None:
            g[k] = v
    return g


def build(g, dev, sdpa):
    """The model, initialized on `dev` itself where torch can (2.x: no
    host-side init of a billion parameters); the same values either way
    for a given seed and device."""
    if hasattr(torch, "device") and hasattr(torch.device, "__enter__") and dev.type != "cpu":
        with dev:
            return GPT(g["layers"], g["d_model"], g["heads"], g["seq"], g["vocab"], sdpa)
    return GPT(g["layers"], g["d_model"], g["heads"], g["seq"], g["vocab"], sdpa).to(dev)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)


def train_step(model, opt, data, step, vocab, amp):
    x, y = data(step)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def state_bytes(model, opt):
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for st in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return n
