# SPDX-License-Identifier: BSD-3-Clause
"""`recover` and its trainer: kill -9 at a random committed step,
relaunch, time launch -> restored -> first step, compare the losses."""
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import torch

from .model import Data, build, geometry, make_optimizer, train_step
from .savers import Skip, dcp_api
from .modes import start_snapsmp, stop_snapsmp
from .report import write_json

# the trainer a recovery trial launches: the script's own entry point
ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench_train.py")


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
        cmd = [sys.executable, ENTRY, "train", "--preset", args.preset, "--device", args.device,
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
