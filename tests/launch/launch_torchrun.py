#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The torchrun recipe (integration/launch/torchrun.sh) with a real snapsmp
and real PyTorch training (tests/python/train.py over gloo, libsnap.torch),
under a stand-in for torchrun (torchrun_standin.py: Debian's torchrun fails
on Python 3.11 here; the stand-in sets the same variables and restarts the
worker group the way torchelastic does).

1. Reference: the stand-in runs train.py without libsnap, uninterrupted.
2. The recipe runs the job with libsnap and --max-restarts; the test waits
   until every worker logged a committed step, measures a step, and SIGKILLs
   one random worker at a random moment within a step, KILLS times (each
   after the restarted group committed again). Checks: torchrun.sh exits 0;
   each restarted group restored a step (from snapsmp, not from scratch), the
   same on every rank and not older than the newest step every rank had
   logged committed before the kill; every loss any launch logged equals the
   reference's bit for bit; the last step was reached; with --flush-dir the
   recipe's stop persisted the last step (its MANIFEST in the flush directory).

usage: launch_torchrun.py --build BUILD --source SRC [--ranks 2] [--steps 24] [--kills 2] [--seed 1]
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fault"))
from events import Waiter, strike_within  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--source", required=True)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--kills", type=int, default=2)
ap.add_argument("--seed", type=int, default=1)
a = ap.parse_args()
rng = random.Random(a.seed)
work = f"/tmp/snaptest-torchrun-{os.getpid()}"
store = f"/dev/shm/snaptest-torchrun-{os.getpid()}"
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
standin = [sys.executable, os.path.join(HERE, "torchrun_standin.py")]
train = os.path.join(a.source, "tests", "python", "train.py")
data = [os.path.join(a.source, "docs", "design", "mesh-and-ec.md"), os.path.join(a.source, "README.md")]
env = dict(os.environ, PYTHONPATH=os.path.join(a.source, "integration", "python"), OMP_NUM_THREADS="1",
           SNAP_COPY_THREADS="1")
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def events(log):
    """(word, [values]) per complete line."""
    out = []
    try:
        with open(log) as f:
            for line in f:
                if line.endswith("\n"):
                    p = line.split()
                    out.append((p[0], p[1:]))
    except FileNotFoundError:
        pass
    return out


def losses(logs):
    got = {}
    for r, log in enumerate(logs):
        for w, v in events(log):
            if w == "step":
                got.setdefault((r, int(v[0])), set()).add(v[1])
    return got


def torch_args(tag, libsnap):
    return (["--nnodes", "1", "--nproc-per-node", str(a.ranks), "--max-restarts", str(a.kills + 1), train,
             "--steps", str(a.steps), "--log", os.path.join(work, f"{tag}-r%r.log"), "--data", *data] +
            (["--libsnap"] if libsnap else []))


# ---- 1. reference ----
ref_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}   # no libsnap: no sanitizer runtime
r = subprocess.run(standin + torch_args("ref", False), env=ref_env, capture_output=True, text=True, timeout=600)
if r.returncode != 0:
    sys.exit(f"FAIL: the reference run exited {r.returncode}: {r.stdout}{r.stderr}")
ref = losses([os.path.join(work, f"ref-r{i}.log") for i in range(a.ranks)])

# ---- 2. the recipe, with kills ----
logs = [os.path.join(work, f"run-r{i}.log") for i in range(a.ranks)]
out = open(os.path.join(work, "recipe.out"), "w")
cmd = ["bash", os.path.join(a.source, "integration", "launch", "torchrun.sh"), "--store", store, "--job", "tr",
       "--flush-dir", os.path.join(work, "disk"), "--snapsmp", os.path.join(a.build, "smp", "snapsmp"),
       "--log", os.path.join(work, "snapsmp.log"), "--torchrun", " ".join(standin), "--"] + torch_args("run", True)
recipe = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
waiter = Waiter()
waiter.watch(work)


def groups():
    with open(os.path.join(work, "recipe.out")) as f:
        return [[int(p) for p in line.split()[1:]] for line in f if line.startswith("workers ")]


def committed(log):
    return [int(v[0]) for w, v in events(log) if w == "committed"]


kills = []
for k in range(a.kills):
    # this group's workers, each past a committed step since the group began
    g0 = len(groups())
    base = [len(committed(log)) for log in logs]
    if not waiter.until(lambda: all(len(committed(log)) > b for log, b in zip(logs, base)), limit=300,
                        procs=[recipe]):
        fail(f"kill {k}: the workers committed nothing (see {work})")
        break
    t0 = time.monotonic()
    n0 = len(committed(logs[0]))
    if not waiter.until(lambda: len(committed(logs[0])) > n0, limit=300, procs=[recipe]):
        fail(f"kill {k}: no further commit (see {work})")
        break
    step_time = time.monotonic() - t0
    floor = min(max(committed(log)) for log in logs)
    strike_within(rng, step_time)
    victim = rng.choice(groups()[-1])
    try:
        os.kill(victim, 9)
    except ProcessLookupError:
        pass
    kills.append(floor)
    print(f"kill {k}: SIGKILL of worker {victim} within a step ({step_time:.2f} s); every rank had committed "
          f"step {floor}", flush=True)
    if not waiter.until(lambda: len(groups()) > g0 or recipe.poll() is not None, limit=300, procs=[recipe]):
        fail(f"kill {k}: the stand-in did not restart the group")
rc = recipe.wait(timeout=900)
out.close()
waiter.close()
if rc != 0:
    fail(f"torchrun.sh exited {rc}; see {work}/recipe.out")

# ---- checks ----
restores = [[v[0] for w, v in events(log) if w == "restored"] for log in logs]
launches = min(len(x) for x in restores)
if launches < len(kills) + 1:
    fail(f"{launches} launches logged a restore, expected {len(kills) + 1}")
for i in range(1, launches):
    steps = {x[i] for x in restores}
    if len(steps) != 1 or "none" in steps:
        fail(f"restart {i}: the ranks restored {steps}, expected one step restored from snapsmp")
    elif int(steps.pop()) < kills[i - 1]:
        fail(f"restart {i}: restored {[x[i] for x in restores]}, older than step {kills[i - 1]} every rank had "
             "committed before the kill")
got = losses(logs)
bad = [(key, sorted(v), ref.get(key)) for key, v in got.items() if v != ref.get(key)]
if bad:
    fail(f"{len(bad)} losses differ from the reference, e.g. {bad[:3]}")
if any((r, a.steps) not in got for r in range(a.ranks)):
    fail(f"the last step {a.steps} was not reached on every rank")
manifest = os.path.join(work, "disk", "tr", f"step-{a.steps}", "MANIFEST")
if not os.path.exists(manifest):
    fail(f"the recipe's stop did not persist step {a.steps}: no {manifest}")
if failures:
    print(f"launch_torchrun: {len(failures)} failure(s); see {work}")
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
shutil.rmtree(store, ignore_errors=True)
print(f"launch_torchrun: OK: {len(kills)} workers SIGKILLed, the group restarted by the stand-in restored from "
      f"snapsmp each time, {len(got)} losses equal the reference, step {a.steps} persisted by the recipe's stop")
