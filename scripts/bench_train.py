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
"""
import argparse
import ctypes
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

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


# ---- host and device measurements -------------------------------------------

def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssShmem", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_hwm():
    """VmHWM back to the current RSS (Linux: clear_refs 5), so each mode's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def du(path):
    n = 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    for root, _, files in os.walk(path):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return n


def host_pinned_peak():
    f = getattr(torch.cuda, "host_memory_stats", None)
    if f is None or not torch.cuda.is_available():
        return None
    try:
        st = f()
        return int(st.get("allocated_bytes.all.peak", st.get("reserved_bytes.all.peak", 0)))
    except Exception:
        return None


def reset_host_pinned_peak():
    f = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
    if f is not None and torch.cuda.is_available():
        try:
            f()
        except Exception:
            pass


def d2h_gbps(dev, nbytes=1 << 30):
    """Device-to-host copy speed into pinned memory (cudaMemcpyAsync), best of 3: what a state's copy can reach."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = None
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    del src, dst
    return round(nbytes / best / 1e9, 2)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def ms(x):
    return None if x is None else round(x * 1e3, 3)


# ---- savers: one per checkpointing kind --------------------------------------

class Skip(Exception):
    """A mode this torch cannot run (said in the JSON and on stderr)."""


class NoSave:
    kind = "none"

    def save(self, step):
        pass

    def finish(self):
        pass

    def probe(self, step):
        return None

    def pinned(self):
        return None

    def close(self):
        pass

    def bytes_on_shm(self):
        return 0


class SnapSave(NoSave):
    kind = "libsnap"

    def __init__(self, model, opt, store, codec, device, copy_threads):
        import libsnap.torch
        more = {"copy_threads": copy_threads} if copy_threads else {}
        self.ck = libsnap.torch.Checkpointer(model, opt, job=JOB, store=store, codec=codec, fence_forward=False,
                                             **more)
        self.copy_threads = self.ck.settings["copy_threads"]
        self.store, self.cuda = store, device.type == "cuda"

    def save(self, step):
        self.ck.save(step)

    def finish(self):
        self.ck.wait()

    def probe(self, step):
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.ck.save(step)
        self.ck.wait()
        return time.perf_counter() - t0

    def pinned(self):
        from libsnap import _capi as C
        L = C.lib()
        L.snap_pinned.restype, L.snap_pinned.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        v = ctypes.c_uint64()
        return int(v.value) if L.snap_pinned(self.ck._ctx.h, ctypes.byref(v)) == 0 else None

    def bytes_on_shm(self):
        return du(self.store)

    def close(self):
        self.ck.close()


def dcp_api():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as e:
        raise Skip(f"torch {torch.__version__} has no torch.distributed.checkpoint ({e})")
    if not hasattr(dcp, "async_save"):
        raise Skip(f"torch {torch.__version__}'s torch.distributed.checkpoint has no async_save")
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    except ImportError as e:
        raise Skip(f"torch {torch.__version__} has no torch.distributed.checkpoint.state_dict ({e})")
    return dcp, get_state_dict, set_state_dict


def dcp_writer(dcp, path):
    """FileSystemWriter, with its pinned staging cache where it has one
    (what DCP's async tutorial recommends for repeated saves)."""
    W = dcp.FileSystemWriter
    try:
        return W(path, cache_staged_state_dict=True), "FileSystemWriter(cache_staged_state_dict=True)"
    except TypeError:
        return W(path), "FileSystemWriter"


class DcpSave(NoSave):
    kind = "dcp"

    def __init__(self, model, opt, root):
        self.dcp, self.get_sd, _ = dcp_api()
        self.model, self.opt, self.root = model, opt, root
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        self.fut = None
        self.done_at = {}      # step -> perf_counter when its save completed
        self.issued = {}
        self.writer = self.writer_kind = None
        self.errors = []

    def _resolve(self, r):
        # newer torch returns AsyncSaveResponse(staging_completion, upload_completion)
        return getattr(r, "upload_completion", r)

    def save(self, step):
        if self.fut is not None:
            self.fut.result()
        msd, osd = self.get_sd(self.model, self.opt)
        path = os.path.join(self.root, f"step-{step:08d}")
        if self.writer is None:    # one writer for every save: its staging cache is reused
            self.writer, self.writer_kind = dcp_writer(self.dcp, path)
        self.issued[step] = time.perf_counter()
        f = self._resolve(self.dcp.async_save({"model": msd, "optim": osd}, storage_writer=self.writer,
                                              checkpoint_id=path))

        def done(_f, step=step):
            self.done_at[step] = time.perf_counter()
            # keep the newest checkpoint only, off the training thread
            for d in os.listdir(self.root):
                if d < f"step-{step:08d}":
                    shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)
            try:
                _f.result()
            except Exception as e:
                self.errors.append(repr(e))
        f.add_done_callback(done)
        self.fut = f

    def finish(self):
        if self.fut is not None:
            self.fut.result()
        if self.errors:
            raise RuntimeError("dcp.async_save failed: " + self.errors[0])

    def probe(self, step):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.save(step)
        self.finish()
        return time.perf_counter() - t0

    def commits(self):
        return [self.done_at[s] - self.issued[s] for s in self.done_at if s in self.issued]

    def bytes_on_shm(self):
        return du(self.root)

    def close(self):
        self.finish()


class TorchSave(NoSave):
    kind = "torch.save"

    def __init__(self, model, opt, path):
        self.model, self.opt, self.path = model, opt, path

    def save(self, step):
        tmp = self.path + ".tmp"
        torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, self.path)

    def probe(self, step):
        t0 = time.perf_counter()
        self.save(step)
        return time.perf_counter() - t0

    def bytes_on_shm(self):
        return du(self.path) if os.path.exists(self.path) else 0

    def close(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# ---- bench --------------------------------------------------------------------

def start_snapsmp(args, state):
    if not args.snapsmp:
        return None
    shutil.rmtree(args.store, ignore_errors=True)
    limit = args.mem_limit or str(3 * state + (1 << 30))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    # its own output goes to a file: a daemon holding this process's stdout
    # would keep a pipe reading it (tee) open after this process is gone
    with open(args.store.rstrip("/") + ".smp.log", "w") as log:
        p = subprocess.Popen([args.snapsmp, "--store", args.store, "--mem-limit", limit, "--quiet"], env=env,
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    with open(args.store.rstrip("/") + ".smp.pid", "w") as f:   # for a wrapper that must stop it
        f.write(f"{p.pid}\n")
    sock = os.path.join(args.store, "smp.sock")
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            with open(args.store.rstrip("/") + ".smp.log") as f:
                why = f.read()[-2000:]
            stop_snapsmp(p, args.store)
            raise SystemExit(f"snapsmp did not start (exit {p.poll()}): {why}")
        time.sleep(0.01)
    return p


def stop_snapsmp(p, store):
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p is not None:
        shutil.rmtree(store, ignore_errors=True)
        for ext in (".smp.pid", ".smp.log"):
            try:
                os.unlink(store.rstrip("/") + ext)
            except FileNotFoundError:
                pass


def parse_mode(m):
    name, _, every = m.partition("@")
    return name, int(every) if every else 1


def bench(args):
    dev = torch.device(args.device)
    g = geometry(args)
    amp = args.amp and dev.type == "cuda"
    torch.manual_seed(args.seed)
    model = build(g, dev, sdpa=hasattr(F, "scaled_dot_product_attention"))
    init = [p.detach().clone() for p in model.parameters()]
    data = Data(g["vocab"], g["seq"], g["batch"], args.seed, dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model)
    train_step(model, opt, data, 0, g["vocab"], amp)     # creates Adam's state: the full state's size
    state = state_bytes(model, opt)
    del opt
    smp = start_snapsmp(args, state)
    d2h = d2h_gbps(dev) if dev.type == "cuda" else None
    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "device": args.device,
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "preset": args.preset, "geometry": g, "params": nparams, "state_bytes": state, "amp_bf16": amp,
            "steps": args.steps, "warmup": args.warmup, "store": args.store, "shm_dir": args.shm,
            "d2h_pinned_gbps": d2h, "state_copy_ms_at_d2h": None if not d2h else round(state / d2h / 1e6, 1),
            "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "plain"}
    print(f"# {args.preset}: {nparams / 1e6:.1f}M params, state {state / 2**30:.2f} GiB, device "
          f"{meta['gpu'] or 'cpu'}, torch {torch.__version__}", flush=True)
    out = {"meta": meta, "modes": []}
    gstep = [0]   # global step number for saves: increases across modes (one job in the store)
    base_peak = [None]
    try:
        for m in args.modes:
            r = run_mode(args, m, model, init, data, g, amp, dev, gstep, base_peak)
            out["modes"].append(r)
            print(fmt_row(r), flush=True)
            if args.json:
                write_json(args.json, finish(out))
    finally:
        stop_snapsmp(smp, args.store)
    out = finish(out)
    print(table(out), flush=True)
    if args.json:
        write_json(args.json, out)
    return out


def run_mode(args, m, model, init, data, g, amp, dev, gstep, base_peak):
    name, every = parse_mode(m)
    cuda = dev.type == "cuda"
    with torch.no_grad():
        for p, p0 in zip(model.parameters(), init):
            p.copy_(p0)
    opt = make_optimizer(model)
    r = {"mode": m, "kind": None, "every": every, "codec": None, "status": "ok"}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    reset_host_pinned_peak()
    rss0 = proc_status()
    reset_hwm()
    t_setup = time.perf_counter()
    try:
        if name.startswith("base"):
            saver = NoSave()
        elif name.startswith("snap"):
            # snap[-lossless][-tN]: the lossless codec, N copy threads
            parts = name.split("-")[1:]
            bad = [x for x in parts if x != "lossless" and not (x[:1] == "t" and x[1:].isdigit())]
            if bad:
                raise SystemExit(f"mode {m!r}: unknown part {bad[0]!r} (snap[-lossless][-tN]@K)")
            codec = "lossless" if "lossless" in parts else None
            threads = next((int(x[1:]) for x in parts if x[:1] == "t"), args.copy_threads)
            r["codec"] = codec or "none"
            saver = SnapSave(model, opt, args.store, codec, dev, threads)
            r["copy_threads"] = saver.copy_threads
        elif name == "dcp":
            saver = DcpSave(model, opt, os.path.join(args.shm, "bench_train_dcp"))
        elif name == "torch":
            saver = TorchSave(model, opt, os.path.join(args.shm, "bench_train_torch.pt"))
        else:
            raise SystemExit(f"unknown mode {m!r}; modes: {', '.join(ALL_MODES)}")
    except Skip as e:
        print(f"SKIP {m}: {e}", file=sys.stderr, flush=True)
        r.update(status="skipped", reason=str(e))
        return r
    r["kind"] = saver.kind
    steps, stalls, losses = [], [], []
    first_save = None
    mode_t0 = time.perf_counter()
    try:
        # warmup: the first saves pin the slots / create DCP's staging cache
        for w in range(args.warmup):
            gstep[0] += 1
            train_step(model, opt, data, w + 1, g["vocab"], amp).item()
            # libsnap: two saves, so both slots are mapped and pinned; DCP:
            # one, which allocates its staging cache; torch.save keeps nothing
            nwarm = {"libsnap": 2, "dcp": 1}.get(saver.kind, 0)
            if w >= args.warmup - nwarm:
                t0 = time.perf_counter()
                saver.save(gstep[0])
                if first_save is None:
                    first_save = time.perf_counter() - t0
        saver.finish()
        if cuda:
            torch.cuda.synchronize()
        last = time.perf_counter()
        for i in range(args.steps):
            s = args.warmup + i + 1
            gstep[0] += 1
            loss = train_step(model, opt, data, s, g["vocab"], amp)
            if saver.kind != "none" and (i + 1) % every == 0:
                t0 = time.perf_counter()
                saver.save(gstep[0])
                stalls.append(time.perf_counter() - t0)
            losses.append(loss.item())     # the loop's one sync with the GPU, as a training log does
            now = time.perf_counter()
            steps.append(now - last)
            last = now
            if args.mode_budget_s and now - mode_t0 > args.mode_budget_s:
                r["status"] = "truncated"
                r["reason"] = f"stopped after {i + 1} steps: over --mode-budget-s {args.mode_budget_s}"
                break
        t0 = time.perf_counter()
        saver.finish()
        r["drain_ms"] = ms(time.perf_counter() - t0)
        probes = []
        if saver.kind != "none":
            for _ in range(args.probes):
                gstep[0] += 1
                probes.append(saver.probe(gstep[0]))
        r["pinned_bytes"] = saver.pinned()
        r["shm_bytes"] = saver.bytes_on_shm()
        if isinstance(saver, DcpSave):
            r["dcp_writer"] = saver.writer_kind
            c = saver.commits()
            r["commit_in_training_ms"] = {"median": ms(statistics.median(c)) if c else None, "n": len(c)}
    except Exception as e:
        r.update(status="failed", reason=f"{type(e).__name__}: {e}")
        print(f"FAILED {m}: {r['reason']}", file=sys.stderr, flush=True)
        try:
            saver.close()
        except Exception:
            pass
        return r
    saver.close()
    st = proc_status()
    r["steps"] = len(steps)
    r["step_ms"] = {"median": ms(statistics.median(steps)), "mean": ms(statistics.fmean(steps)),
                    "p10": ms(pct(steps, 0.1)), "p90": ms(pct(steps, 0.9)), "max": ms(max(steps))}
    r["saves"] = len(stalls)
    r["stall_ms"] = {"median": ms(statistics.median(stalls)), "max": ms(max(stalls)),
                     "mean": ms(statistics.fmean(stalls))} if stalls else None
    r["first_save_ms"] = ms(first_save)
    r["commit_ms"] = {"median": ms(statistics.median(probes)), "min": ms(min(probes)),
                      "n": len(probes)} if probes else None
    r["host_rss_start_bytes"] = rss0.get("VmRSS")
    r["host_rss_peak_bytes"] = st.get("VmHWM")
    r["host_rss_added_bytes"] = st.get("VmHWM", 0) - rss0.get("VmRSS", 0)
    r["host_shmem_rss_bytes"] = st.get("RssShmem")
    r["host_pinned_torch_peak_bytes"] = host_pinned_peak()
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        if name == "base":
            base_peak[0] = peak
        r["gpu_peak_bytes"] = peak
        r["gpu_added_bytes"] = None if base_peak[0] is None else peak - base_peak[0]
        free, total = torch.cuda.mem_get_info()
        # the device as the driver sees it, torch's cache included: also
        # what libsnap_cuda allocates outside torch (codec scratch, streams)
        r["gpu_driver_used_bytes"] = total - free
    r["losses"] = [float(x).hex() for x in losses]
    r["wall_s"] = round(time.perf_counter() - t_setup, 2)
    del opt
    return r


def finish(out):
    """Overheads and the < 1% frequency, from the baseline's mean step."""
    modes = out["modes"]
    base = next((r for r in modes if r["mode"] == "base" and r["status"] != "skipped" and r.get("step_ms")), None)
    if base is None:
        return out
    b = base["step_ms"]["mean"]
    for r in modes:
        if not r.get("step_ms"):
            continue
        mean = r["step_ms"]["mean"]
        r["overhead_pct"] = round(100.0 * (mean - b) / b, 2)
        if r["kind"] not in (None, "none") and r.get("saves"):
            cost = max(0.0, (mean - b) * r["every"])     # ms per save, over the baseline
            r["save_cost_ms"] = round(cost, 3)
            r["every_k_for_1pct"] = max(1, math.ceil(cost / (0.01 * b) - 1e-9))
        if base.get("gpu_driver_used_bytes") is not None and r.get("gpu_driver_used_bytes") is not None:
            r["gpu_driver_added_bytes"] = r["gpu_driver_used_bytes"] - base["gpu_driver_used_bytes"]
        if r["mode"] == "base2":
            out["meta"]["noise_pct"] = r["overhead_pct"]
        if r is not base and "losses" in r and "losses" in base:
            n = min(len(r["losses"]), len(base["losses"]))
            r["losses_equal_base"] = r["losses"][:n] == base["losses"][:n]
    return out


def write_json(path, out):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def _g(x, k=None, scale=1.0, fmt="{:.2f}"):
    v = x if k is None else (x or {}).get(k)
    return "-" if v is None else fmt.format(v * scale if scale != 1.0 else v)


def fmt_row(r):
    if r["status"] in ("skipped", "failed"):
        return f"{r['mode']:<20} {r['status'].upper()}: {r.get('reason')}"
    return (f"{r['mode']:<20} {_g(r['step_ms'], 'median'):>9} {_g(r['step_ms'], 'p10'):>8}-{_g(r['step_ms'], 'p90'):<8} "
            f"{_g(r['step_ms'], 'mean'):>9} {_g(r.get('overhead_pct')):>7} {_g(r.get('stall_ms'), 'median'):>9} "
            f"{_g(r.get('stall_ms'), 'max'):>9} {_g(r.get('commit_ms'), 'median'):>9} "
            f"{_g(r.get('every_k_for_1pct'), fmt='{}'):>6} {_g(r.get('host_rss_added_bytes'), scale=2**-30):>7} "
            f"{_g(r.get('pinned_bytes') or r.get('host_pinned_torch_peak_bytes'), scale=2**-30):>7} "
            f"{_g(r.get('gpu_added_bytes'), scale=2**-30):>7}")


HEADER = (f"{'mode':<20} {'med ms':>9} {'p10-p90 ms':^17} {'mean ms':>9} {'ovh %':>7} {'stall ms':>9} "
          f"{'stall max':>9} {'commit ms':>9} {'1%@K':>6} {'RSS+GiB':>7} {'pin GiB':>7} {'GPU+GiB':>7}")


def table(out):
    m = out["meta"]
    lines = [f"{m['preset']} ({m['params'] / 1e6:.0f}M params, state {m['state_bytes'] / 2**30:.2f} GiB) on "
             f"{m['gpu'] or 'cpu'}, torch {m['torch']}, {m['steps']} steps/mode"
             + (f", noise (base2 vs base) {m['noise_pct']}%" if "noise_pct" in m else "")
             + (f", D2H pinned {m['d2h_pinned_gbps']} GB/s (state copy {m['state_copy_ms_at_d2h']} ms)"
                if m.get("d2h_pinned_gbps") else ""), HEADER]
    lines += [fmt_row(r) for r in out["modes"]]
    return "\n".join(lines)


# ---- recovery -------------------------------------------------------------------

def trainer(args):
    """One training process of the recovery trials: restores if it can,
    trains to --steps, saving as --ckpt says; logs events on stdout with
    time.time() stamps."""
    t_imported = time.time()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=True)   # a non-deterministic op shows as unequal losses
    g = geometry(args)
    amp = args.amp and dev.type == "cuda"

    def say(*a):
        sys.stdout.write(" ".join(str(x) for x in a) + "\n")
        sys.stdout.flush()

    say("imported", repr(t_imported))
    torch.manual_seed(args.seed)
    model = build(g, dev, sdpa=False)
    opt = make_optimizer(model)
    data = Data(g["vocab"], g["seq"], g["batch"], args.seed, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    say("built", repr(time.time()))
    start, ck, dcp_state = 0, None, None
    if args.ckpt == "snap":
        import libsnap.torch
        more = {"copy_threads": args.copy_threads} if args.copy_threads else {}
        ck = libsnap.torch.Checkpointer(model, opt, job=args.job, store=args.store, fence_forward=False, **more)
        got = ck.restore()
        start = got or 0
    elif args.ckpt == "dcp":
        dcp, get_sd, set_sd = dcp_api()
        os.makedirs(args.ckpt_path, exist_ok=True)
        done = sorted(d for d in os.listdir(args.ckpt_path)
                      if os.path.exists(os.path.join(args.ckpt_path, d, ".metadata")))
        if done:
            msd, osd = get_sd(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=os.path.join(args.ckpt_path, done[-1]))
            set_sd(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            start = int(done[-1].split("-")[1])
        dcp_state = {"dcp": dcp, "get": get_sd, "fut": None}
    elif args.ckpt == "torch":
        if os.path.exists(args.ckpt_path):
            try:
                sd = torch.load(args.ckpt_path, map_location=dev, weights_only=True)
            except Exception:     # torch 1.13's weights_only unpickler cannot read its own optimizer state
                sd = torch.load(args.ckpt_path, map_location=dev, weights_only=False)
            model.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optim"])
            start = sd["step"]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    say("restored", start, repr(time.time()))
    committed = 0
    for s in range(start + 1, args.steps + 1):
        loss = train_step(model, opt, data, s, g["vocab"], amp)
        say("step", s, loss.item().hex(), repr(time.time()))
        if args.ckpt == "snap" and s % args.every == 0:
            ck.save(s)
            lat = ck.latest()
            if lat is not None and lat > committed:
                committed = lat
                say("committed", lat)
        elif args.ckpt == "dcp" and s % args.every == 0:
            if dcp_state["fut"] is not None:
                dcp_state["fut"].result()
                say("committed", dcp_state["step"])
            msd, osd = dcp_state["get"](model, opt)
            path = os.path.join(args.ckpt_path, f"step-{s:08d}")
            r = dcp_state["dcp"].async_save({"model": msd, "optim": osd}, checkpoint_id=path)
            dcp_state["fut"], dcp_state["step"] = getattr(r, "upload_completion", r), s
        elif args.ckpt == "torch" and s % args.every == 0:
            tmp = args.ckpt_path + ".tmp"
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": s}, tmp)
            os.replace(tmp, args.ckpt_path)
            say("committed", s)
    if ck is not None:
        ck.wait()
        say("committed", args.steps)
        ck.close()
    if dcp_state is not None and dcp_state["fut"] is not None:
        dcp_state["fut"].result()
        say("committed", dcp_state["step"])
    say("done", repr(time.time()))


class Launch:
    def __init__(self, args, ckpt, every, steps):
        cmd = [sys.executable, os.path.abspath(__file__), "train", "--preset", args.preset, "--device", args.device,
               "--steps", str(steps), "--ckpt", ckpt, "--every", str(every), "--seed", str(args.seed),
               "--store", args.store, "--job", "bench_recover_" + ckpt]
        for k in ("layers", "d_model", "heads", "seq", "batch", "vocab"):
            if getattr(args, k) is not None:
                cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
        if not args.amp:
            cmd.append("--no-amp")
        if args.copy_threads:
            cmd += ["--copy-threads", str(args.copy_threads)]
        if ckpt == "dcp":
            cmd += ["--ckpt-path", os.path.join(args.shm, "bench_recover_dcp")]
        elif ckpt == "torch":
            cmd += ["--ckpt-path", os.path.join(args.shm, "bench_recover_torch.pt")]
        env = dict(os.environ)
        if args.device == "cuda":
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self.t0 = time.time()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        self.events = []

    def read_until(self, pred):
        """Events (stdout lines: blocking reads, no timers) until pred(event) or the trainer's end."""
        for line in self.p.stdout:
            ev = line.split()
            self.events.append(ev)
            if pred(ev):
                return ev
        return None

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def finish(self):
        self.read_until(lambda ev: False)
        return self.p.wait()

    def losses(self):
        return {int(e[1]): e[2] for e in self.events if e and e[0] == "step"}

    def first(self, word):
        return next((e for e in self.events if e and e[0] == word), None)


def recover(args):
    rng = random.Random(args.seed)
    smp = None
    if args.snapsmp:
        shutil.rmtree(args.store, ignore_errors=True)
        smp = start_snapsmp(args, 0 if args.mem_limit else 1 << 30)
    out = {"meta": {"torch": torch.__version__, "device": args.device, "preset": args.preset,
                    "geometry": geometry(args), "steps": args.steps,
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}, "runs": []}
    failures = []
    try:
        ref = Launch(args, "none", 1, args.steps)
        rc = ref.finish()
        if rc != 0:
            raise SystemExit(f"reference run failed (exit {rc})")
        want = ref.losses()
        kinds = [("snap", 1), ("dcp", args.every_other), ("torch", args.every_other)]
        for ckpt, every in kinds:
            if ckpt == "dcp":
                try:
                    dcp_api()
                except Skip as e:
                    print(f"SKIP recovery from dcp: {e}", file=sys.stderr, flush=True)
                    out["runs"].append({"ckpt": "dcp", "status": "skipped", "reason": str(e)})
                    continue
            r = recover_one(args, rng, ckpt, every, want)
            out["runs"].append(r)
            if args.json:    # after each run: a phase cut by its time limit keeps what it measured
                write_json(args.json, out)
            if r["status"] != "ok":
                failures.append(f"{ckpt}: {r.get('reason')}")
            print(f"recovery {ckpt:<6} killed after committed step {r.get('killed_after')}, restored "
                  f"{r.get('restored_step')}: launch->restored {r.get('launch_to_restored_s')} s, "
                  f"->first step {r.get('launch_to_first_step_s')} s (restore {r.get('restore_s')} s), "
                  f"losses equal: {r.get('losses_equal')}", flush=True)
    finally:
        stop_snapsmp(smp, args.store)
        for p in ("bench_recover_dcp", "bench_recover_torch.pt"):
            q = os.path.join(args.shm, p)
            shutil.rmtree(q, ignore_errors=True) if os.path.isdir(q) else (os.path.exists(q) and os.unlink(q))
    snap = next((r for r in out["runs"] if r["ckpt"] == "snap" and r["status"] == "ok"), None)
    for r in out["runs"]:
        if snap and r is not snap and r["status"] == "ok":
            r["vs_snap_first_step"] = round(r["launch_to_first_step_s"] / snap["launch_to_first_step_s"], 2)
    out["failures"] = failures
    if args.json:
        write_json(args.json, out)
    if failures:
        print("FAIL: " + "; ".join(failures), file=sys.stderr)
    return out


def recover_one(args, rng, ckpt, every, want):
    for p in ("bench_recover_dcp", "bench_recover_torch.pt"):
        q = os.path.join(args.shm, p)
        shutil.rmtree(q, ignore_errors=True) if os.path.isdir(q) else (os.path.exists(q) and os.unlink(q))
    lo = every
    hi = max(lo, ((args.steps - 2) // every) * every)
    target = rng.randint(lo, hi)
    r = {"ckpt": ckpt, "every": every, "kill_target": target, "status": "ok"}
    a = Launch(args, ckpt, every, args.steps)
    ev = a.read_until(lambda e: e and e[0] == "committed" and int(e[1]) >= target)
    if ev is None:
        a.finish()
        r.update(status="failed", reason=f"the trainer ended before committing step {target} (exit {a.p.returncode})")
        return r
    a.kill()
    r["killed_after"] = int(ev[1])
    b = Launch(args, ckpt, every, args.steps)
    rc = b.finish()
    if rc != 0:
        r.update(status="failed", reason=f"the relaunch failed (exit {rc})")
        return r
    imp, built, rest = b.first("imported"), b.first("built"), b.first("restored")
    first = next((e for e in b.events if e and e[0] == "step"), None)
    restored = int(rest[1])
    r["restored_step"] = restored
    r["launch_to_imported_s"] = round(float(imp[1]) - b.t0, 3)
    r["launch_to_built_s"] = round(float(built[1]) - b.t0, 3)
    r["restore_s"] = round(float(rest[2]) - float(built[1]), 3)
    r["launch_to_restored_s"] = round(float(rest[2]) - b.t0, 3)
    r["launch_to_first_step_s"] = round(float(first[3]) - b.t0, 3) if first else None
    got = {**a.losses(), **b.losses()}
    bad = [s for s in range(1, args.steps + 1) if got.get(s) != want.get(s)]
    after = b.losses()
    r["losses_equal"] = not bad
    r["steps_after_resume"] = len(after)
    if restored < r["killed_after"]:
        r.update(status="failed", reason=f"restored step {restored}, older than the committed {r['killed_after']}")
    elif bad:
        r.update(status="failed", reason=f"losses differ from the uninterrupted run at steps {bad[:5]}")
    return r


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
