#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""integration/launch/mpirun.sh with real processes: 4 simulated nodes on this
machine (one snapsmp each, --ec 3+1, stores under /dev/shm), one example
trainer per node beside it, run through the recipe as a user would.

  1. A trainer rank is SIGKILLed mid-run (at a random moment within a step
     duration measured on its log). The recipe must relaunch the trainers and
     every rank must restore a step not older than the newest step all ranks
     had committed just before the kill; with --require-one-step (as ctest
     runs it), the same step on every rank (a split was a snapsmp bug, now
     fixed; without the flag a split is only reported).
  2. A snapsmp rank is SIGKILLed mid-run: Open MPI takes the whole mesh down,
     the recipe must relaunch mesh and trainers (it relaunches both after any
     failure), and the ranks restore again (not older than what all had
     committed).
  3. The trainers then finish every step; the recipe stops the mesh (each
     node logs its shutdown) and exits 0. The trainer checks every restored
     byte itself (exit 3 on a mismatch, which fails the run here).
usage: launch_mpirun.py --build BUILD_DIR --source SOURCE_DIR [--seed N] [--require-one-step]
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, strike_within  # noqa: E402

NODES = 4


def log_lines(path):
    try:
        with open(path) as f:
            return [ln.split() for ln in f if ln.endswith("\n")]
    except FileNotFoundError:
        return []


def last_committed(path):
    c = None
    for p in log_lines(path):
        if len(p) == 2 and p[0] == "committed" and p[1].isdigit():
            c = int(p[1])
    return c


def restores(path):
    return [int(p[1]) if p[0] == "restored" else 0 for p in log_lines(path)
            if len(p) == 2 and p[0] in ("restored", "fresh") and p[1].isdigit()]


def pids_where(pred):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if pred(int(d), [a.decode(errors="replace") for a in argv]):
                out.append(int(d))
        except OSError:
            continue
    return out


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def agreed(got, floor, what, strict):
    """The step the ranks restored after `what`: never older than `floor`;
    one step for all (strict), or a split reported."""
    if min(got) < floor:
        raise RuntimeError(f"after {what} the ranks restored {got}, older than step {floor} which all had committed")
    if len(set(got)) != 1:
        msg = f"after {what} the ranks restored different steps {got} (per rank)"
        if strict:
            raise RuntimeError(msg)
        print(f"WARNING (a split is a snapsmp bug; --require-one-step fails on it): {msg}")
    return min(got)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--require-one-step", action="store_true")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"launch_mpirun: seed {seed}")
    store = f"/dev/shm/snaptest-launch-{os.getpid()}"
    logdir = f"/tmp/snaptest-launch-{os.getpid()}"
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(logdir, exist_ok=True)
    trainer = os.path.join(a.build, "integration", "trainer")
    logs = [os.path.join(logdir, f"r{r}.log") for r in range(NODES)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1", SNAP_COPY_THREADS="1", SNAP_TIMEOUT_MS="60000")
    cmd = [os.path.join(a.source, "integration", "launch", "mpirun.sh"), "--simulate", "--nodes", str(NODES),
           "--ec", "3+1", "--store", store, "--mem-limit", "64M", "--restarts", "2", "--log-dir", logdir,
           "--snapsmp", os.path.join(a.build, "smp", "snapsmp"), "--job", "lt", "--",
           "bash", "-c", f"exec {trainer} --steps $LT_STEPS --bytes 64K --compute-us 2000 --resume --quiet "
                         f"--log {logdir}/r$OMPI_COMM_WORLD_RANK.log"]
    final = 70
    env["LT_STEPS"] = str(final)
    err = open(os.path.join(logdir, "recipe.err"), "w")
    recipe = subprocess.Popen(cmd, env=env, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
    w = Waiter()
    ok = False
    try:
        def all_at(n, after=0):
            """Every rank has committed n, on a run started after `after` restores."""
            return all(len(restores(p)) > after and (last_committed(p) or -1) >= n for p in logs)

        def step_time(rank, a_, b_, after):
            t = {}
            def seen(s):
                c = last_committed(logs[rank])
                if len(restores(logs[rank])) > after and c is not None and c >= s:
                    t.setdefault(s, time.monotonic())
                    return True
                return False
            if not w.until(lambda: seen(a_), 240, dirs=lambda: [logdir], procs=[recipe]):
                raise RuntimeError(f"rank {rank} never committed step {a_}")
            if not w.until(lambda: seen(b_), 240, dirs=lambda: [logdir], procs=[recipe]):
                raise RuntimeError(f"rank {rank} never committed step {b_}")
            return (t[b_] - t[a_]) / (b_ - a_)

        # ---- 1. kill a trainer rank -----------------------------------------
        if not w.until(lambda: all_at(10), 240, dirs=lambda: [logdir], procs=[recipe]):
            raise RuntimeError("the trainers did not reach step 10 through the recipe")
        d = step_time(2, 12, 22, 0)
        strike_within(rng, d)
        floor = min(last_committed(p) for p in logs)
        victims = pids_where(lambda pid, argv: argv[0] == trainer and f"{logdir}/r2.log" in argv)
        if len(victims) != 1:
            raise RuntimeError(f"trainer rank 2: found pids {victims}")
        os.kill(victims[0], signal.SIGKILL)
        print(f"phase 1: SIGKILL trainer rank 2 (pid {victims[0]}); every rank had committed step {floor}")
        if not w.until(lambda: all(len(restores(p)) >= 2 for p in logs), 240, dirs=lambda: [logdir],
                       procs=[recipe]):
            raise RuntimeError("the recipe did not relaunch the trainers after a trainer died")
        r1 = agreed([restores(p)[1] for p in logs], floor, "the trainer kill", a.require_one_step)
        print(f"phase 1: the recipe relaunched the trainers; the ranks restored step {r1}")

        # ---- 2. kill a daemon: the mesh goes down ----------------------------
        if not w.until(lambda: all_at(r1 + 10, 1), 240, dirs=lambda: [logdir], procs=[recipe]):
            raise RuntimeError("the relaunched trainers made no progress")
        d = step_time(0, r1 + 12, r1 + 22, 1)
        strike_within(rng, d)
        floor = min(last_committed(p) for p in logs)
        smp = os.path.join(a.build, "smp", "snapsmp")
        victims = [p for p in pids_where(lambda pid, argv: argv[0] == smp and f"{store}/node%n" in argv)
                   if environ_of(p).get(b"OMPI_COMM_WORLD_RANK") == b"1"]
        if len(victims) != 1:
            raise RuntimeError(f"snapsmp node 1: found pids {victims}")
        os.kill(victims[0], signal.SIGKILL)
        print(f"phase 2: SIGKILL snapsmp node 1 (pid {victims[0]}); every rank had committed step {floor}")
        if not w.until(lambda: all(len(restores(p)) >= 3 for p in logs), 240, dirs=lambda: [logdir],
                       procs=[recipe]):
            raise RuntimeError("the recipe did not relaunch mesh and trainers after a daemon died")
        r2 = agreed([restores(p)[2] for p in logs], floor, "the daemon kill", a.require_one_step)
        print(f"phase 2: the recipe relaunched mesh and trainers; the ranks restored step {r2}")

        # ---- 3. finish --------------------------------------------------------
        rc = recipe.wait(timeout=600)
        err.flush()
        text = open(os.path.join(logdir, "recipe.err")).read()
        mesh = open(os.path.join(logdir, "snapsmp.log")).read()
        if rc != 0:
            raise RuntimeError(f"the recipe exited {rc}:\n{text}")
        for r, p in enumerate(logs):
            if last_committed(p) != final:
                raise RuntimeError(f"rank {r} ended at step {last_committed(p)}, not {final}")
        # Phase 1: the trainers fail (137); phase 2: the mesh or, first, the
        # trainers that lost their daemons. Each time both are relaunched.
        status = re.findall(r"the trainers exited with status (\d+)", text)
        if "3" in status or text.count("starting the mesh") != 3 or len(status) + text.count("the mesh exited") != 2:
            raise RuntimeError(f"want two failures (no trainer status 3) and three mesh starts:\n{text}")
        if len(re.findall(r"job lt step \d+ protected", mesh)) < NODES:
            raise RuntimeError("the mesh protected no step")
        if mesh.count("shutting down") < NODES:
            raise RuntimeError(f"not every node logged its shutdown:\n{mesh[-2000:]}")
        if "AddressSanitizer" in mesh or "runtime error:" in mesh or "LeakSanitizer" in mesh:
            raise RuntimeError("sanitizer report in the mesh log")
        print(f"phase 3: every rank finished step {final}; the recipe stopped the mesh and exited 0")
        ok = True
    finally:
        if recipe.poll() is None:
            os.killpg(recipe.pid, signal.SIGTERM)
            try:
                recipe.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(recipe.pid, signal.SIGKILL)
        # Open MPI moves ranks to process groups of their own; they stay in the session.
        left = pids_where(lambda pid, argv: os.getsid(pid) == recipe.pid)
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        w.close()
        err.close()
        shutil.rmtree(store, ignore_errors=True)
        if ok:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"logs kept in {logdir}")
    return 0


sys.exit(main())
