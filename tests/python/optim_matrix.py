#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch with every optimizer torch has, ZeroRedundancyOptimizer (over
AdamW; over Adam with two param groups and parameters_as_bucket_view) and
DistributedDataParallel, each with an LR scheduler and a GradScaler, under
SIGKILL: 2 ranks over gloo (tests/python/optim_train.py, one case after
another in each process) against one real snapsmp.

1. Two uninterrupted runs without libsnap: their losses and state digests
   must be identical (gloo's reductions of two ranks are deterministic);
   this is the reference.
2. One launch per case with libsnap: wait until a rank logs "committed C k"
   for a random odd step k of that case, SIGKILL both ranks at a random
   moment within the next step (its median duration in the reference), and
   relaunch. The next launch finishes the killed case first: the step it
   restores must be >= k, and the digest of the full state right after
   restore (model, the optimizer's own state_dict(), for ZeRO also the
   consolidated one, scheduler, scaler, torch/numpy/random generators) must
   equal the digest of the state at that step before the kill, per rank.
3. Every loss and digest any launch logs equals the reference's, so the
   resumed loss curve is the uninterrupted one.
4. From the node store, load_state_dict of the ZeRO cases at world size 1
   (and with no world size, and at 3) equals ZeroRedundancyOptimizer's own
   consolidated state_dict() at the last step, and loads into a plain
   AdamW/Adam and a 1-rank ZeroRedundancyOptimizer; at world size 2 each rank's
   shard equals its local optimizer's state_dict(); the DDP case's model
   loads with prefix "module." under the wrapper's names; LBFGS (the
   generic state_dict path) gives its own state_dict().

The seed is printed; --seed replays a run's choices.

usage: optim_matrix.py --build BUILD --src SRC [--seed N] [--steps 10] [--cases a,b,...]
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, free_port, strike_within, wait_socket  # noqa: E402

ALL = ["sgd", "adam", "adamw", "adagrad", "rmsprop", "adadelta", "adamax", "nadam", "radam", "asgd",
       "sparseadam", "rprop", "lbfgs", "zero", "ddp", "zerogroups"]
ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--src", required=True)
ap.add_argument("--seed", type=int, default=None)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--cases", default=",".join(ALL))
args = ap.parse_args()
seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
print(f"optim_matrix: seed {seed} (replay with --seed {seed})", flush=True)
rng = random.Random(seed)
cases = args.cases.split(",")
here = os.path.dirname(os.path.abspath(__file__))
snapsmp = os.path.join(args.build, "smp", "snapsmp")
store = f"/dev/shm/snaptest-pymx-{os.getpid()}"
root = os.path.join(args.build, "tests", "python", f"matrix-{os.getpid()}")
native_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
RANKS = 2
failures = []


def fail(msg):
    print("FAIL: " + msg, flush=True)
    failures.append(msg)


def parse(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break      # torn by the kill
                out.append(line.split())
    except FileNotFoundError:
        pass
    return out


class Launch:
    def __init__(self, tag, libsnap=True, hold=""):
        self.dir = os.path.join(root, tag)
        os.makedirs(self.dir)
        env0 = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(RANKS),
                    SNAP_STORE=store, SNAP_TIMEOUT_MS="60000", SNAP_COPY_THREADS="1", OMP_NUM_THREADS="1",
                    PYTHONPATH=os.path.join(args.src, "integration", "python"))
        if not libsnap:
            env0.pop("LD_PRELOAD", None)
        self.procs, self.logs = [], []
        for r in range(RANKS):
            log = os.path.join(self.dir, f"r{r}.log")
            cmd = [sys.executable, os.path.join(here, "optim_train.py"), "--log", log, "--steps", str(args.steps),
                   "--cases", ",".join(cases), "--seed", str(seed % 100000), "--out", root, "--hold", hold]
            with open(os.path.join(self.dir, f"r{r}.err"), "w") as e:
                self.procs.append(subprocess.Popen(cmd + (["--libsnap"] if libsnap else []),
                                                   env=dict(env0, RANK=str(r)), stdout=e, stderr=e))
            self.logs.append(log)

    def events(self, r):
        return parse(self.logs[r])

    def has(self, r, *words):
        return any(ev[:len(words)] == list(words) for ev in self.events(r))

    def until(self, pred, limit=240):
        return waiter.until(pred, limit, dirs=lambda: [self.dir], procs=self.procs)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def wait_all(self):
        if not self.until(lambda: all(p.poll() is not None for p in self.procs), 300):
            self.kill_all()
            return False
        return all(p.returncode == 0 for p in self.procs)

    def stderr(self, r):
        with open(os.path.join(self.dir, f"r{r}.err")) as f:
            return f.read()[-3000:]


def stopped(proc):
    """The process has stopped itself (SIGSTOP): state T in /proc."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def step_durations(launch):
    """Seconds between consecutive saves of a case on a rank ("t" lines)."""
    out = []
    for r in range(RANKS):
        at = {(ev[1], int(ev[2])): float(ev[3]) for ev in launch.events(r) if ev[0] == "t" and len(ev) == 4}
        out += [t - at[(c, s - 1)] for (c, s), t in at.items() if (c, s - 1) in at]
    return out


def table(launch, word):
    """(rank, case, step) -> value of the `word` lines."""
    out = {}
    for r in range(RANKS):
        for ev in launch.events(r):
            if ev[0] == word and len(ev) == 4:
                out[(r, ev[1], int(ev[2]))] = ev[3]
    return out


def main():
    global waiter
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    waiter = Waiter()
    smp = subprocess.Popen([snapsmp, "--store", store, "--quiet"], env=native_env)
    if not wait_socket(store, smp):
        print("snapsmp did not start")
        return 1
    try:
        run()
    finally:
        smp.send_signal(signal.SIGTERM)
        smp.wait()
        shutil.rmtree(store, ignore_errors=True)
    if failures:
        print(f"optim_matrix: {len(failures)} failures (seed {seed})")
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print("optim_matrix: all checks passed")
    return 0


def run():
    t0 = time.monotonic()
    refs = []
    for i in range(2):
        t = time.monotonic()
        ref = Launch(f"reference{i}", libsnap=False)
        if not ref.wait_all():
            fail(f"reference run {i} failed:\n{ref.stderr(0)}\n{ref.stderr(1)}")
            return
        refs.append((ref, time.monotonic() - t))
    want_loss, want_dig = table(refs[0][0], "step"), table(refs[0][0], "digest")
    if want_loss != table(refs[1][0], "step") or want_dig != table(refs[1][0], "digest"):
        fail("two uninterrupted runs differ: gloo is not deterministic here, the loss comparison would be void")
        return
    if len(want_loss) != RANKS * len(cases) * args.steps:
        fail(f"the reference logged {len(want_loss)} steps, expected {RANKS * len(cases) * args.steps}")
        return
    print(f"reference: 2 identical uninterrupted runs, {len(cases)} cases x {args.steps} steps, "
          f"{refs[0][1]:.1f} s each", flush=True)

    seen_dig = {}           # (rank, case, step) -> digest logged before a kill
    floor = {}              # case -> the step every rank had logged committed
    compared, kills, n, in_next = 0, 0, 0, 0
    durs, unfinished_miss = step_durations(refs[0][0]), []

    def check(launch, tag):
        nonlocal compared
        for k, v in table(launch, "step").items():
            if want_loss.get(k) != v:
                fail(f"{tag}: rank {k[0]} {k[1]} step {k[2]}: loss {v}, the uninterrupted run's {want_loss.get(k)}")
        restored = {}
        for r in range(RANKS):
            after = False
            for ev in launch.events(r):
                if ev[0] == "restored":
                    restored[(r, ev[1])] = None if ev[2] == "none" else int(ev[2])
                    after = ev[2] != "none"
                elif ev[0] == "digest" and after:
                    # the first digest after "restored": the state restore() left
                    after = False
                    key = (r, ev[1], int(ev[2]))
                    before = seen_dig.get(key)
                    if before is None:
                        fail(f"{tag}: rank {r} {ev[1]} restored step {ev[2]}, which no launch logged saving")
                    elif before != ev[3]:
                        fail(f"{tag}: rank {r} {ev[1]}: the state after restoring step {ev[2]} (digest {ev[3]}) "
                             f"is not the state saved at that step (digest {before})")
                    else:
                        compared += 1
                elif ev[0] == "digest":
                    if want_dig.get((r, ev[1], int(ev[2]))) != ev[3]:
                        fail(f"{tag}: rank {r} {ev[1]} step {ev[2]}: state digest {ev[3]}, the uninterrupted "
                             f"run's {want_dig.get((r, ev[1], int(ev[2])))}")
                    seen_dig[(r, ev[1], int(ev[2]))] = ev[3]
        for c in cases:
            got = {restored.get((r, c), "absent") for r in range(RANKS)}
            if len(got) > 1:
                fail(f"{tag}: {c}: the ranks restored different steps {got}")
            s = got.pop()
            if s not in ("absent", None) and s < floor.get(c, 0):
                fail(f"{tag}: {c}: restored step {s}, but every rank had committed step {floor[c]}")
            if s is None and floor.get(c, 0) > 0:
                fail(f"{tag}: {c}: restored nothing, but every rank had committed step {floor[c]}")
        for c in cases:
            done = [max([0] + [int(ev[2]) for ev in launch.events(r) if ev[0] == "committed" and ev[1] == c])
                    for r in range(RANKS)]
            floor[c] = max(floor.get(c, 0), min(done))

    for n, c in enumerate(cases):
        k = rng.choice(range(1, args.steps - 1, 2))
        launch = Launch(f"kill{n}-{c}", hold=f"{c}:{k}")
        # both ranks stop themselves once they logged step k committed
        ok = launch.until(lambda: all(launch.has(r, "held", c, str(k)) for r in range(RANKS))
                          or any(p.poll() is not None for p in launch.procs))
        # the stop follows the log line; /proc shows it (no file event to wait on)
        deadline = time.monotonic() + 60
        while ok and not all(stopped(p) for p in launch.procs) and time.monotonic() < deadline:
            time.sleep(0.001)
        if not ok or any(p.poll() is not None for p in launch.procs):
            fail(f"launch {n}: ended or stalled before {c} committed step {k}:\n{launch.stderr(0)}")
            launch.kill_all()
            check(launch, f"launch {n}")
            return
        durs += step_durations(launch)
        dur = sorted(durs)[len(durs) // 2]
        for p in launch.procs:
            p.send_signal(signal.SIGCONT)
        strike_within(rng, dur)
        launch.kill_all()
        kills += 1
        # the last step either rank logged: k + 1 when the kill landed in the
        # step after the commit (a slow driver may land later; still a kill)
        last = max(int(ev[2]) for r in range(RANKS) for ev in launch.events(r) if ev[0] == "step" and ev[1] == c)
        if any(ev[:2] == ["done", c] for r in range(RANKS) for ev in launch.events(r)):
            unfinished_miss.append(c)
        elif last <= k + 1:
            in_next += 1
        check(launch, f"launch {n} (kill in {c} after step {k})")
        print(f"launch {n}: killed both ranks in {c} {dur * 1000:.1f} ms after step {k} committed; the last step "
              f"logged: {last}", flush=True)
    final = Launch("final")
    if not final.wait_all():
        fail(f"the final launch failed:\n{final.stderr(0)}\n{final.stderr(1)}")
        return
    check(final, "final launch")
    # a driver starved of CPU may strike after the case ended (the kill is
    # still a kill, but no restore of that case follows); most must not
    if len(unfinished_miss) > len(cases) // 2:
        fail(f"{len(unfinished_miss)} of {len(cases)} kills landed after their case ended: {unfinished_miss}")
    want_n = RANKS * (len(cases) - len(unfinished_miss))
    if compared < want_n:
        fail(f"only {compared} restores were compared with their saved state, expected {want_n}")
    print(f"{kills} launches killed ({in_next} in the step after the commit, {len(unfinished_miss)} after the "
          f"case ended: {unfinished_miss}), {compared} restored states equal to the saved ones, every logged "
          f"loss and state digest equal to the uninterrupted run's", flush=True)
    loads()
    print(f"optim_matrix: {time.monotonic() - t0:.1f} s", flush=True)


def same(a, b, what):
    import torch
    if torch.is_tensor(a) or torch.is_tensor(b):
        ok = torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a, b)
        if not ok:
            fail(f"{what}: {a!r} != {b!r}")
    elif isinstance(a, dict):
        if not isinstance(b, dict) or list(a) != list(b):
            fail(f"{what}: keys {list(a)} != {list(b) if isinstance(b, dict) else b}")
            return
        for k in a:
            same(a[k], b[k], f"{what}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            fail(f"{what}: {a} != {b}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
    elif a != b:
        fail(f"{what}: {a!r} != {b!r}")


def local_model():
    """optim_train.py's MLP as a plain sequence (the same parameter order)."""
    import torch
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Linear(24, 6))


def loads():
    import torch
    import torch.distributed as dist
    import libsnap.torch as lt
    if not dist.is_initialized():   # a 1-rank group for ZeroRedundancyOptimizer
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    n0 = len(failures)
    for z in ("zero", "zerogroups"):
        if z not in cases:
            continue
        f = [torch.load(os.path.join(root, f"{z}-rank{r}.pt")) for r in range(RANKS)]
        want = f[0]["consolidated"]
        for ws in (1, None, 3):
            sd = lt.load_state_dict(store, job=f"mx-{z}", **({} if ws is None else {"world_size": ws, "rank": 0}))
            same(sd["optimizer"], want, f"{z}: load_state_dict(world_size={ws}) vs ZeroRedundancyOptimizer's "
                 "consolidated state_dict()")
            same(sd["optimizer_layout"], "zero-consolidated", f"{z}: layout")
            same(sd["step"], args.steps, f"{z}: step")
        for r in range(RANKS):
            sd = lt.load_state_dict(store, job=f"mx-{z}", world_size=RANKS, rank=r, prefix="module.")
            same(sd["optimizer"], f[r]["local"], f"{z}: rank {r}'s shard vs its local optimizer's state_dict()")
            same(sd["model"], f[r]["model"], f"{z}: rank {r}'s model (prefix module.)")
        # the consolidated dictionary loads into a plain optimizer, and into
        # a ZeroRedundancyOptimizer of one rank (which takes its part itself)
        sd = lt.load_state_dict(store, job=f"mx-{z}", world_size=1, rank=0)
        plain = local_model()
        groups = [{"params": list(plain[0].parameters())}, {"params": list(plain[1].parameters())}] \
            if z == "zerogroups" else list(plain.parameters())
        opt = (torch.optim.Adam if z == "zerogroups" else torch.optim.AdamW)(groups)
        opt.load_state_dict(sd["optimizer"])
        same(opt.state_dict(), want, f"{z}: the consolidated state loaded into a plain optimizer")
        from torch.distributed.optim import ZeroRedundancyOptimizer
        zopt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.Adam if z == "zerogroups"
                                       else torch.optim.AdamW)
        zopt.load_state_dict(lt.load_state_dict(store, job=f"mx-{z}")["optimizer"])
        zopt.consolidate_state_dict(to=0)
        same(zopt.state_dict(), want, f"{z}: loaded into a ZeroRedundancyOptimizer of world size 1")
        print(f"{z}: load_state_dict at world size 1, 3 and whole = the consolidated state_dict(); at 2 each "
              "rank's shard = its local optimizer's; it loads into AdamW/Adam and a 1-rank ZeRO", flush=True)
    if "ddp" in cases:
        want = torch.load(os.path.join(root, "ddp-rank0.pt"))
        sd = lt.load_state_dict(store, job="mx-ddp", world_size=1, rank=0, prefix="module.")
        same(sd["model"], want["model"], "ddp: model with prefix module.")
        same(sd["optimizer"], want["optimizer"], "ddp: optimizer")
        bare = lt.load_state_dict(store, job="mx-ddp")
        same(list(bare["model"]), [k[len("module."):] for k in want["model"]], "ddp: the names without prefix")
        print("ddp: load_state_dict gives the module's names, and with prefix='module.' the wrapper's", flush=True)
    if "lbfgs" in cases:
        want = torch.load(os.path.join(root, "lbfgs-rank0.pt"))
        sd = lt.load_state_dict(store, job="mx-lbfgs", world_size=1, rank=0)
        same(sd["optimizer"], want["optimizer"], "lbfgs: optimizer (state_dict path)")
        same(sd["optimizer_layout"], "state_dict", "lbfgs: layout")
    if len(failures) == n0:
        print("load_state_dict: as the optimizers' own state_dict()s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
