#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Relaunch in one pass: nodes whose copy is intact serve restores while the
mesh rebuilds a lost node (mpirun -np NODES snapsmp --ec K+M, one store per
node on this machine, rank r on node r, real trainers). Event-driven:

  overlap: the trainers protect step S and exit; the mesh is SIGKILLed and
           node L's store deleted. On the relaunch, as soon as every
           survivor's socket is there (they serve; their mesh threads are in
           the rebuild, which needs L), node L's daemon is stopped (SIGSTOP):
           the rebuild cannot end while it is stopped. The survivors' ranks
           must restore S, verified bit-exact by the trainer, while L's log has
           not said its rebuild is done and L has no socket. Then L resumes,
           finishes its rebuild, and its rank restores S bit-exact. The
           warm-up of the next protect waits on each node until its
           relaunched ranks restored: node L does not log the end of its
           relaunch restores before its rank restored; every node logs it.
  kill:    the same relaunch, node L held in its rebuild again, the
           survivors' ranks restoring, and the whole mesh SIGKILLed at a
           random moment within the time the overlap trial's restores took
           (trainers started -> every survivor's rank restored). Each
           rank either restored S bit-exact (trainer exit 0) or failed with a
           clear error (exit 1, its message); never a mismatch (exit 3).
           A relaunch after it restores S bit-exact on every rank.
  failed:  node L's new store is a tmpfs too small for its part, so its
           rebuild fails with ENOSPC once L resumes. The survivors' ranks
           restored S while L was held (provisionally: S stands only if the
           rebuild succeeds) and wait (--then-fifo); once the mesh logged the
           failed rebuild they are let go, and their first save must be
           refused, naming the restore during the rebuild and its failure:
           no rank trains on from a step the others cannot restore. The
           overlap trial's survivors, let go after L's rebuild succeeded,
           saved step S+1 (the same check does not refuse them). Needs
           mount(2) (root, as in CI): an optional case without it.

usage: mesh_overlap.py --build DIR [--shape 2+2] [--nodes 4] [--trials 4] [--seed N]
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter, strike_within  # noqa: E402
from mesh_memory import daemons  # noqa: E402
from mesh_trials import JOB, Mesh, have_record, restored_of, setup, start_trainers  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import Skips, can_mount  # noqa: E402

DONE = "relaunch rebuild done here"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="2+2")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--bytes", default="32M")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    a.world = 0
    base, logdir = setup(a, "snaptest-meshoverlap")
    a.world = a.nodes   # rank r on node r
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    mesh = Mesh(a, base)
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []
    step = 3
    lost = a.nodes - 1
    survivors = [n for n in range(a.nodes) if n != lost]
    print(f"mesh_overlap: {a.shape} nodes={a.nodes} bytes={a.bytes} lost node {lost} trials={a.trials} seed={seed}",
          flush=True)

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def node_said(n, what):
        return any(ln.startswith(f"node {n}:") or f" node {n}: " in ln
                   for ln in mesh.text().splitlines() if what in ln)

    def socks(nodes):
        return all(os.path.exists(os.path.join(mesh.root(n), "smp.sock")) for n in nodes)

    skips = Skips()
    mounted = []

    def fifos(tag, ranks):
        out = {}
        for r in ranks:
            out[r] = os.path.join(logdir, f"{tag}-then{r}")
            os.mkfifo(out[r])
        return out

    def go(paths):
        for p in paths.values():
            with open(p, "w") as f:   # the trainer, past its restore, opens it for reading
                f.write("g")

    def relaunch_losing(tag, small=None):
        """Kill, delete node `lost`'s store (small: a tmpfs of that size in its
        place), relaunch without waiting; True once the survivors serve."""
        mesh.kill()
        shutil.rmtree(mesh.root(lost))
        if small:
            os.makedirs(mesh.root(lost))
            m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={small}", "tmpfs", mesh.root(lost)],
                               capture_output=True, text=True)
            if m.returncode != 0:
                raise RuntimeError(f"mount of a {small} tmpfs on {mesh.root(lost)} failed: {m.stderr.strip()}")
            mounted.append(mesh.root(lost))
        mesh.start(os.path.join(logdir, f"{tag}.log"), wait=False)
        waiter.watch(os.path.dirname(mesh.root(0)))
        for n in survivors:
            waiter.watch(mesh.root(n))
        return waiter.until(lambda: socks(survivors) or mesh.proc.poll() is not None, limit=120,
                            procs=[mesh.proc]) and socks(survivors)

    def unmount():
        while mounted:
            subprocess.run(["umount", mounted.pop()])

    def relaunch_held(tag, tries=5, small=None):
        """relaunch_losing, then node `lost` stopped inside its rebuild: its pid,
        or None when every try's rebuild ended before the stop could land."""
        for i in range(tries):
            unmount()
            if not relaunch_losing(f"{tag}-{i}", small):
                raise RuntimeError(f"the survivors did not serve; see {mesh.log}")
            pid = daemons(mesh).get(lost)
            if pid is None:
                raise RuntimeError("no daemon of the lost node")
            os.kill(pid, signal.SIGSTOP)
            if not node_said(lost, DONE) and not socks([lost]):
                return pid
            os.kill(pid, signal.SIGCONT)
            print(f"{tag}: try {i}: the rebuild ended before node {lost} was stopped; again", flush=True)
        return None

    def run_ranks(tag, ranks, limit=300, timed=None, then=None, last=step):
        """Trainers of ranks to the end: rank -> (exit, step restored, stderr).
        timed (a list): gets the time from their start to every rank's restore.
        then (a callable): run once every rank restored; the trainers wait
        for it to end (--then-fifo) before they save up to step `last`."""
        t0 = time.monotonic()
        gos = fifos(tag, ranks) if then else {}
        procs = start_trainers(a, mesh, logdir, tag, last, ranks=ranks,
                               extra_of=lambda r: ["--then-fifo", gos[r]] if then else [])
        if timed is not None or then:
            waiter.until(lambda: all(p.poll() is not None or os.path.exists(log) and restored_of(log) is not None
                                     for p, log, _ in procs), limit, procs=[p for p, _, _ in procs])
        if timed is not None:
            timed.append(time.monotonic() - t0)
        if then:
            then()
            go({r: gos[r] for r, (p, _, _) in zip(ranks, procs) if p.poll() is None})
        out = {}
        for r, (p, log, err) in zip(ranks, procs):
            p.wait(timeout=limit)
            with open(err) as f:
                out[r] = (p.returncode, restored_of(log) if os.path.exists(log) else None, f.read().strip())
        return out

    try:
        mesh.start(os.path.join(logdir, "mesh0.log"))
        got = run_ranks("first", list(range(a.world)))
        if any(rc for rc, _, _ in got.values()):
            fail(f"first run: {got}")
        if not waiter.until(lambda: have_record(mesh, a, step), limit=120, dirs=lambda: [
                os.path.join(mesh.root(n), JOB, "ec") for n in range(a.nodes)]):
            fail(f"step {step} was not protected on every node; see {mesh.log}")
            raise RuntimeError("no protected step")

        # ---- overlap: survivors restore while node `lost` is held in its rebuild ----
        pid = relaunch_held("overlap")
        if pid is None:
            fail("the lost node finished its rebuild before it could be stopped in every try (nothing overlapped)")
            raise RuntimeError("no overlap")
        timed = []

        def resume_lost():
            held = not node_said(lost, DONE) and not socks([lost])
            if not held:
                fail(f"overlap: node {lost} said its rebuild was done while it was stopped")
            print(f"overlap: ranks {survivors} restored step {step} bit-exact while node {lost} was held in its "
                  f"rebuild (done: {node_said(lost, DONE)}, socket: {socks([lost])})", flush=True)
            os.kill(pid, signal.SIGCONT)
            if not waiter.until(lambda: socks([lost]) and node_said(lost, DONE), limit=120, procs=[mesh.proc],
                                dirs=lambda: [mesh.root(lost)] if os.path.isdir(mesh.root(lost)) else []):
                raise RuntimeError(f"node {lost} did not finish its rebuild; see {mesh.log}")

        # The survivors' ranks restore, wait for the rebuild to end, then save step+1.
        got = run_ranks("overlap-survivors", survivors, timed=timed, then=resume_lost, last=step + 1)
        window = max(timed[0], 0.01)   # the survivors' trainers: start -> every one restored
        for r, (rc, res, err) in got.items():
            if rc != 0 or res != step:
                fail(f"overlap: rank {r} on a survivor: exit {rc}, restored {res} (expected {step}), then saved "
                     f"step {step + 1} after the rebuild succeeded: {err}")
        # What the failed trial's small store is sized from: the lost node's rebuilt part.
        part = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(mesh.root(lost), JOB))
                   for f in fs)
        # The warm-up of the next protect waits for the relaunch's restores
        # on each node: on the rebuilt node its rank has not restored yet.
        ENDED = "relaunch restores ended here ("
        if node_said(lost, ENDED):
            fail(f"node {lost} ended its relaunch restores before its rank restored")
        got = run_ranks("overlap-lost", [lost])
        rc, res, err = got[lost]
        if rc != 0 or res != step:
            fail(f"overlap: rank {lost} on the rebuilt node: exit {rc}, restored {res}: {err}")
        if not waiter.until(lambda: all(node_said(n, ENDED) for n in range(a.nodes)), limit=120, procs=[mesh.proc]):
            fail(f"not every node logged the end of its relaunch restores; see {mesh.log}")

        # ---- kill: SIGKILL of the mesh while survivors restore during the rebuild ----
        outcomes = {"restored": 0, "after": 0, "error": 0}
        for t in range(a.trials):
            # Held in its rebuild again: the kill lands inside the overlap.
            during = relaunch_held(f"kill{t}") is not None
            nodes = list(daemons(mesh).values())   # looked up ahead: the kill is one syscall per node
            procs = start_trainers(a, mesh, logdir, f"kill{t}", step, ranks=survivors)
            strike_within(rng, window)
            for pid in nodes:
                os.kill(pid, signal.SIGKILL)
            killed = time.time()
            mesh.kill()
            for r, (p, log, err) in zip(survivors, procs):
                p.wait(timeout=120)
                res = restored_of(log) if os.path.exists(log) else None
                with open(err) as f:
                    msg = f.read().strip()
                if p.returncode == 0 and res == step:
                    outcomes["restored"] += 1
                    # its restore ended after the kill: it read what it was handed, checked
                    outcomes["after"] += os.path.getmtime(log) > killed
                elif p.returncode == 1 and msg:
                    outcomes["error"] += 1
                else:
                    fail(f"kill {t}: rank {r}: exit {p.returncode}, restored {res}, stderr {msg!r} (seed {seed})")
            # A full relaunch: every rank restores the step bit-exact.
            mesh.start(os.path.join(logdir, f"kill{t}-after.log"))
            got = run_ranks(f"kill{t}-after", list(range(a.world)))
            for r, (rc, res, err) in got.items():
                if rc != 0 or res != step:
                    fail(f"kill {t}: after the relaunch rank {r}: exit {rc}, restored {res}: {err} (seed {seed})")
            if not during:
                fail(f"kill {t}: node {lost} had finished its rebuild before it was held")
            print(f"kill {t}: struck inside the rebuild, while the survivors' ranks restored; then every rank "
                  f"restored step {step} bit-exact", flush=True)
        print(f"kill: struck within {window * 1000:.0f} ms; survivors' ranks restored {outcomes['restored']} (of them {outcomes['after']} "
              f"ended after the kill), failed with a clear error "
              f"{outcomes['error']}; no mismatch", flush=True)

        # ---- failed: the rebuild fails after the survivors restored during it ----
        if skips.optional("failed rebuild", "CAP_SYS_ADMIN to mount a small tmpfs (root, as in CI)", can_mount()):
            small = f"{max(part * 3 // 5 // 1024, 256)}k"   # room for part of the lost node's files only
            pid = relaunch_held("failed", small=small)
            if pid is None:
                fail(f"failed: node {lost}'s rebuild into a {small} store ended before it could be stopped")
            else:
                FAILED = f"rebuild of step {step} failed"

                def fail_rebuild():
                    os.kill(pid, signal.SIGCONT)
                    if not waiter.until(lambda: FAILED in mesh.text(), limit=120, procs=[mesh.proc]):
                        fail(f"failed: the rebuild into a {small} store did not fail; see {mesh.log}")

                got = run_ranks("failed", survivors, then=fail_rebuild, last=step + 2)
                want = [f"restored step {step} on node", "while the relaunch rebuilt the lost nodes", FAILED,
                        "store space exhausted"]
                before = len(failures)
                for r, (rc, res, err) in got.items():
                    if rc != 1 or res != step or any(w not in err for w in want):
                        fail(f"failed: rank {r} on a survivor: exit {rc}, restored {res}; expected exit 1 after "
                             f"restoring {step}, its save refused with {want}: {err!r}")
                if len(failures) == before:
                    print(f"failed: ranks {survivors} restored step {step} during a rebuild that then failed (node "
                          f"{lost}'s store {small}); their first save was refused by name", flush=True)
        mesh.stop()
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    finally:
        mesh.kill()
        unmount()
    if failures:
        print(f"mesh_overlap: {len(failures)} failure(s); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print(f"mesh_overlap: OK ({skips.summary()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
