# SPDX-License-Identifier: BSD-3-Clause
"""`bench`: the same training run in each mode, one after the other."""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from .model import ALL_MODES, Data, build, geometry, make_optimizer, state_bytes, train_step
from .measure import d2h_gbps, host_pinned_peak, ms, pct, proc_status, reset_host_pinned_peak, reset_hwm
from .savers import DcpSave, NoSave, Skip, SnapSave, TorchSave
from .report import finish, fmt_row, table, write_json


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
