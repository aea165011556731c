#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch under SIGKILL: a real training run (tests/python/train.py: a
small transformer with dropout, AdamW, StepLR, real text, torch + numpy +
random noise, RANKS processes over gloo) against one real snapsmp.

1. Reference: the same script without libsnap, uninterrupted: the loss of
   every (rank, step), as float.hex.
2. Trials: launch every rank with libsnap; wait for the event the trial
   interrupts, chosen in turn: a training step ("step s" logged), a save
   ("save-begin s" logged) or a restore ("restore-begin" logged); SIGKILL one
   random rank at a random moment within that event's duration as measured
   in earlier launches, then the rest of the job (as a launcher would), and
   relaunch. Every loss any launch logs must be bit-identical to the
   reference's for that rank and step (so every resume restored model,
   Adam state, schedule, and the torch, numpy and random generators
   exactly); every rank of a launch must restore the same step, not older
   than the newest step every rank had logged committed, nor newer than
   any rank had begun to save.
3. Final launch: runs to the last step; every rank's steps 1..STEPS must
   have been logged over the launches.
4. Mismatches (--mismatch): relaunch with another model width, another
   optimizer type, and one rank fewer. Each must fail on every rank with a
   MismatchError naming what differs, and leave the store as it was (the
   same newest restorable step, `snaptool verify` clean); a last normal
   launch restores the final step.

The layout changes during the run (Adam's state appears after the initial
save, the pickled history outgrows its room), so the context is re-opened
mid-run; losing committed steps to that would break the bounds above.

With --device cuda the ranks train on the GPU (all on device 0): the model,
Adam's state and the CUDA generator are GPU regions, saved on the trainer's
stream and fenced inside optimizer.step.

usage: train_trials.py --build BUILD --src SRC [--ranks 2] [--steps 40] [--trials 8] [--seed 1] [--mismatch]
                       [--device cpu|cuda]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, free_port, strike_within, wait_socket  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--src", required=True)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--trials", type=int, default=8)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--mismatch", action="store_true")
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
args = ap.parse_args()
rng = random.Random(args.seed)
here = os.path.dirname(os.path.abspath(__file__))
snapsmp = os.path.join(args.build, "smp", "snapsmp")
snaptool = os.path.join(args.build, "tools", "snaptool")
store = f"/dev/shm/snaptest-py-{os.getpid()}"
logroot = os.path.join(args.build, "tests", "python", f"trials-{os.getpid()}")
data = [os.path.join(args.src, "docs", "design", "mesh-and-ec.md"), os.path.join(args.src, "README.md")]
JOB = "pytrain"
failures = []
# Under ASan the trainers (Python) need the sanitizer runtime preloaded (see
# CMakeLists.txt); snapsmp and snaptool carry their own.
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def parse(path):
    """Events of one log, in order: (word, value); lines torn by a kill are skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                p = line.split(None, 2)
                out.append((p[0], p[1:] if len(p) > 1 else []))
    except FileNotFoundError:
        pass
    return out


class Launch:
    def __init__(self, tag, world=None, extra=(), libsnap=True):
        self.world = world or args.ranks
        self.dir = os.path.join(logroot, tag)
        os.makedirs(self.dir)
        port = free_port()
        self.procs, self.logs, self.errs = [], [], []
        env0 = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(self.world),
                    SNAP_STORE=store, SNAP_JOB=JOB, SNAP_TIMEOUT_MS="60000", SNAP_COPY_THREADS="1",
                    PYTHONPATH=os.path.join(args.src, "integration", "python"), OMP_NUM_THREADS="1")
        if not libsnap:
            env0 = {k: v for k, v in env0.items() if k != "LD_PRELOAD"}   # no libsnap: no sanitizer runtime
        for r in range(self.world):
            log, err = os.path.join(self.dir, f"r{r}.log"), os.path.join(self.dir, f"r{r}.err")
            cmd = [sys.executable, os.path.join(here, "train.py"), "--steps", str(args.steps), "--log", log,
                   "--data", *data, "--device", args.device, *extra] + (["--libsnap"] if libsnap else [])
            with open(err, "w") as e:
                self.procs.append(subprocess.Popen(cmd, env=dict(env0, RANK=str(r)), stdout=e, stderr=e))
            self.logs.append(log)
            self.errs.append(err)
        self.seen = {}   # (rank, word, value) -> driver time it was first seen

    def events(self, r):
        return parse(self.logs[r])

    def note(self):
        now = time.monotonic()
        for r in range(self.world):
            for w, v in self.events(r):
                self.seen.setdefault((r, w, v[0] if v else None), now)

    def until(self, pred, limit=180):
        def p():
            self.note()
            return pred()
        return waiter.until(p, limit, dirs=lambda: [self.dir], procs=self.procs)

    def has(self, r, word, value=None):
        return any(w == word and (value is None or (v and v[0] == str(value))) for w, v in self.events(r))

    def early_exits(self):
        """Ranks that ended before they were killed, with a failure."""
        return [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None and p.returncode != 0]

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def wait_all(self, limit=300):
        if not self.until(lambda: all(p.poll() is not None for p in self.procs), limit):
            self.kill_all()
            return False
        return True

    def stderr(self, r):
        with open(self.errs[r]) as f:
            return f.read()


def losses(launch):
    out = {}
    for r in range(launch.world):
        for w, v in launch.events(r):
            if w == "step":
                out[(r, int(v[0]))] = v[1].strip()
    return out


def restored(launch):
    vals = []
    for r in range(launch.world):
        for w, v in launch.events(r):
            if w == "restored":
                vals.append(None if v[0] == "none" else int(v[0]))
    return vals


def snaptool_latest():
    out = subprocess.run([snaptool, "status", "--store", store, "--job", JOB, "--json"], capture_output=True,
                         text=True, timeout=120, env=native_env)
    if out.returncode != 0:
        raise RuntimeError(f"snaptool status failed: {out.stderr}")
    jobs = json.loads(out.stdout)["jobs"]
    return jobs[0]["latest"] if jobs else None


def main():
    global waiter
    if args.device == "cuda":
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                               capture_output=True, text=True)
        if probe.returncode != 0 or probe.stdout.strip() in ("", "0"):
            print(f"SKIP: --device cuda, but this Python's torch sees no CUDA device "
                  f"({(probe.stdout + probe.stderr).strip()[-200:]}): the GPU trials are not run here")
            return 77
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(logroot, ignore_errors=True)
    os.makedirs(logroot)
    waiter = Waiter()
    smp = subprocess.Popen([snapsmp, "--store", store, "--quiet"], env=native_env)
    if not wait_socket(store, smp):
        print("snapsmp did not start")
        return 1
    try:
        return run(smp)
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)


def run(smp):
    t0 = time.monotonic()
    ref = Launch("reference", libsnap=False)
    if not ref.wait_all() or ref.early_exits():
        print(f"reference run failed: {ref.early_exits()}\n{ref.stderr(0)[-3000:]}")
        return 1
    want = losses(ref)
    print(f"reference: {args.ranks} ranks x {args.steps} steps in {time.monotonic() - t0:.1f} s")

    base, ceil = None, None          # restored step bounds for the next launch
    logged = set()                   # (rank, step) logged by any launch
    step_dur, save_dur, restore_dur = [], [], []
    modes = ["step", "save", "restore"]
    plan = ["step"] + [modes[(i + 1) % 3] for i in range(args.trials - 1)]
    kills = {"step": 0, "save": 0, "restore": 0}
    relayouts = 0

    def check(launch, tag):
        nonlocal base, ceil, relayouts
        got = losses(launch)
        for k, v in got.items():
            logged.add(k)
            if want.get(k) != v:
                fail(f"{tag}: rank {k[0]} step {k[1]}: loss {v}, the uninterrupted run's {want.get(k)}")
        rs = restored(launch)
        if len(set(rs)) > 1:
            fail(f"{tag}: ranks restored different steps {rs}")
        if rs:
            p = rs[0]
            if base is None and p is not None and p != 0:
                fail(f"{tag}: the first launch restored step {p} from an empty store")
            if base is not None and (p is None or p < base):
                fail(f"{tag}: restored step {p}, but every rank had committed step {base} (a committed step lost)")
            if ceil is not None and p is not None and p > ceil:
                fail(f"{tag}: restored step {p}, newer than any rank had begun to save ({ceil})")
            now = top = p if p is not None else 0
        else:
            # killed before any rank logged its restore: the bounds stand (a
            # restore may have happened unlogged; it never lowers the floor)
            now, top = (base or 0), (ceil or 0)
        # what this launch committed (after its restore) raises the floor
        newest, begun, reopened = [], [], 0
        for r in range(launch.world):
            ev = launch.events(r)
            c = [int(v[0]) for w, v in ev if w == "committed"] + ([0] if any(w == "restored" for w, _ in ev) else [])
            newest.append(max([now] + c))
            begun.append(max([top] + [int(v[0]) for w, v in ev if w == "save-begin"]))
            reopened = max([reopened] + [int(v[0]) for w, v in ev if w == "relayouts"])
        relayouts += reopened
        base, ceil = min(newest), max(begun)

    def measure(launch):
        """Durations of the events, from the times the driver saw their log
        lines while it waited (inotify wakes it at each line)."""
        for r in range(launch.world):
            at = {}
            for (rr, w, v), t in launch.seen.items():
                if rr == r:
                    at.setdefault(w, {})[v] = t
            steps = {int(v): t for v, t in at.get("step", {}).items()}
            step_dur.extend(steps[s + 1] - t for s, t in steps.items() if s + 1 in steps)
            for v, t in at.get("save-begin", {}).items():
                if v in at.get("committed", {}):   # odd steps: save, copy, commit
                    save_dur.append(at["committed"][v] - t)
            if "restore-begin" in at and "restored" in at:
                restore_dur.append(min(at["restored"].values()) - at["restore-begin"][None])

    for t in range(args.trials):
        mode = plan[t]
        if mode == "restore" and not restore_dur:
            mode = "step"
        launch = Launch(f"trial{t}")
        victim = rng.randrange(launch.world)
        ok = True
        if mode == "restore":
            ok = launch.until(lambda: launch.has(victim, "restore-begin")
                              or launch.procs[victim].poll() is not None)
            dur = sorted(restore_dur)[len(restore_dur) // 2]
        else:
            ok = launch.until(lambda: launch.has(victim, "restored") or launch.procs[victim].poll() is not None)
            got = [v[0] for w, v in launch.events(victim) if w == "restored"]
            p = int(got[0]) if got and got[0] != "none" else 0
            target = rng.randint(p + 1, p + 6)
            if target >= args.steps:
                mode = "step"      # too close to the end: strike at the last step
                target = args.steps
            word = "step" if mode == "step" else "save-begin"
            ok = ok and launch.until(lambda: launch.has(victim, word, target)
                                     or launch.procs[victim].poll() is not None)
            durs = step_dur if mode == "step" else save_dur
            dur = sorted(durs)[len(durs) // 2] if durs else 0.05   # the median: one slow step must not dominate
        early = launch.early_exits()
        if not ok or early:
            fail(f"trial {t}: launch failed or stalled before the {mode} event (exits {early}); "
                 f"stderr of rank {victim}:\n{launch.stderr(victim)[-3000:]}")
            launch.kill_all()
            break
        strike_within(rng, dur)
        if launch.procs[victim].poll() is None:
            launch.procs[victim].send_signal(signal.SIGKILL)
            kills[mode] += 1
        launch.procs[victim].wait()
        launch.kill_all()
        measure(launch)
        check(launch, f"trial {t} ({mode}, rank {victim})")
        print(f"trial {t}: kill rank {victim} during {mode} (within {dur * 1000:.0f} ms); restored "
              f"{restored(launch)}; next restore >= {base}")

    final = Launch("final")
    if not final.wait_all() or final.early_exits():
        fail(f"final launch failed: exits {[p.returncode for p in final.procs]}\n{final.stderr(0)[-3000:]}")
    else:
        final.note()
        check(final, "final launch")
        missing = [(r, s) for r in range(args.ranks) for s in range(1, args.steps + 1) if (r, s) not in logged]
        if missing:
            fail(f"steps never logged by any launch: {missing[:10]}")
        if relayouts < 2:
            fail(f"the context was re-opened {relayouts} times over all launches; the test expects the layout to change more")
    print(f"{args.trials} launches killed ({kills}), final launch completed; every logged loss "
          f"({len(logged)} of {args.ranks} ranks x {args.steps} steps) bit-identical to the uninterrupted run; "
          f"{relayouts} re-opens with a new layout")

    if args.mismatch and not failures:
        mismatches()
    print(f"train_trials: {time.monotonic() - t0:.1f} s")
    if failures:
        print(f"{len(failures)} failures")
        return 1
    print("train_trials: all checks passed")
    return 0


def mismatches():
    before = snaptool_latest()
    if before != args.steps:
        fail(f"the store's newest restorable step is {before}, expected {args.steps}")
        return
    cases = [("model", args.ranks, ["--d-model", "48"], ["model tensor", "[256, 32]", "[256, 48]"]),
             ("optimizer", args.ranks, ["--optim", "sgd"], ["AdamW", "SGD", "optimizer type differs"]),
             ("rank", args.ranks - 1, [], ["world size"])]
    for name, world, extra, words in cases:
        launch = Launch(f"mismatch-{name}", world=world, extra=extra)
        if not launch.wait_all():
            fail(f"mismatch {name}: the launch did not end")
            continue
        codes = [p.returncode for p in launch.procs]
        msgs = [" ".join(v) for r in range(world) for w, v in launch.events(r) if w == "MISMATCH"]
        if codes != [3] * world or len(msgs) != world:
            fail(f"mismatch {name}: exit codes {codes} (want 3 on every rank), messages {msgs}\n"
                 f"{launch.stderr(0)[-2000:]}")
            continue
        for m in msgs:
            if not all(w in m for w in words):
                fail(f"mismatch {name}: the error does not name what differs ({words}): {m}")
        after = snaptool_latest()
        v = subprocess.run([snaptool, "verify", str(args.steps), "--store", store, "--job", JOB],
                           capture_output=True, text=True, timeout=120, env=native_env)
        if after != before or v.returncode != 0:
            fail(f"mismatch {name}: the store changed: newest restorable step {before} -> {after}, "
                 f"verify exit {v.returncode}: {v.stdout[-500:]}{v.stderr[-500:]}")
        print(f"mismatch {name}: every rank refused: {msgs[0][:200]}")
    launch = Launch("after-mismatch")
    if not launch.wait_all() or launch.early_exits() or restored(launch) != [args.steps] * args.ranks:
        fail(f"after the mismatches a normal launch restored {restored(launch)}, expected step {args.steps} "
             f"on every rank; exits {[p.returncode for p in launch.procs]}")
    else:
        print(f"after the mismatches every rank restored step {args.steps}")


if __name__ == "__main__":
    sys.exit(main())
