#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A relaunch flushes the step it rebuilt, beside the restores, and a
SIGKILL of the mesh inside that window costs nothing: `mpirun -np NODES
snapsmp --ec K+M --flush-dir DISK --flush-every 1000` (only signals and
relaunches flush), example trainers spread over the nodes.

Each trial: the trainers run to a target step and exit; once every node
holds its protect record the mesh is SIGKILLed with the step not persisted.
A random node's store is deleted (up to M lost nodes: rebuilt from parity)
and the mesh relaunched with new trainers, which restore the step while the
mesh flushes it. The test waits for node 0's line saying the relaunch flushes
the step (the event), then either lets it finish or SIGKILLs the whole mesh
at a random moment within the time the first such flush took (measured).
Checks:
  - every rank restores exactly the target step, bit-exact (the trainer
    checks its state, exit 3 otherwise); a rank cut off by the kill may fail
    to connect or restore, never restore anything else;
  - a killed flush leaves the step persisted whole (MANIFEST + every rank
    file) or not listed at all; the next relaunch (no loss) flushes it again
    and it is persisted;
  - a relaunch whose step is already persisted does not write it again
    (no "flushing it now" line);
  - at the end every store is deleted: the mesh cannot rebuild the job and
    the trainers restore the last target step from the disk, bit-exact, which
    proves the relaunch's flush wrote the right bytes.
"""
import argparse
import os
import random
import re
import shutil
import sys
import time

from events import Waiter, strike_within
from mesh_flush import persisted_steps
from mesh_trials import JOB, Mesh, have_record, restored_of, setup, start_trainers

# As a launch recipe runs them: a rank cut off by the kill must not start a
# lone snapsmp on its node's store (it would hold the store the next launch needs).
OWN = {"SNAP_AUTOSTART": "0"}
NOW = "the relaunch restored is not persisted: flushing it now"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="2+1")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--bytes", default="16M")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    base, logdir = setup(a, "snaptest-relaunchflush")
    disk = os.path.join(base, "disk")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"mesh_relaunch_flush: {a.shape} nodes={a.nodes} world={a.world} trials={a.trials} seed={seed}")
    mesh = Mesh(a, base, ["--flush-dir", disk, "--flush-every", "1000", "--flush-keep", "2"])
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []
    flush_time = None
    kills, cut = 0, 0   # kills inside the flush; of them, before the step was whole on disk

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def persisted_line(text, s):
        return re.search(rf"job {JOB} step {s} persisted", text) is not None

    def check_restored(t, procs, want, killed):
        for r, (p, log, err) in enumerate(procs):
            got = restored_of(log) if os.path.exists(log) else None
            if p.returncode == 3 or (got is not None and got != want):
                fail(f"trial {t} rank {r}: restored {got}, exit {p.returncode}, want step {want}; see {err}")
            elif not killed and (p.returncode != 0 or got != want):
                fail(f"trial {t} rank {r}: exit {p.returncode}, restored {got}, want {want}; see {err}")

    step = 0
    try:
        for t in range(a.trials):
            # ---- a protected, unpersisted step, then the mesh killed ----
            mesh.start(os.path.join(logdir, f"mesh{t}.log"))
            target = step + rng.randint(2, 4)
            procs = start_trainers(a, mesh, logdir, f"t{t}", target, env_over=OWN)
            for p, _, _ in procs:
                p.wait()
            if not waiter.until(lambda: have_record(mesh, a, target), limit=60,
                                dirs=lambda: [os.path.join(mesh.root(n), JOB, "ec") for n in range(a.nodes)]):
                fail(f"trial {t}: step {target} was not protected; see {mesh.log}")
                break
            mesh.kill()
            step = target
            if target in persisted_steps([disk]):
                fail(f"trial {t}: step {target} persisted with --flush-every 1000 and no signal")
            lost = rng.randrange(a.nodes)
            shutil.rmtree(mesh.root(lost), ignore_errors=True)

            # ---- the relaunch: rebuild, then restores beside the flush ----
            mesh.start(os.path.join(logdir, f"mesh{t}r.log"))
            procs = start_trainers(a, mesh, logdir, f"t{t}r", target, env_over=OWN)
            pp = [p for p, _, _ in procs]
            if not waiter.until(lambda: NOW in mesh.text(), procs=[mesh.proc]):
                fail(f"trial {t}: the relaunch did not flush step {target}; see {mesh.log}")
                break
            began = time.monotonic()
            strike = flush_time is not None and rng.random() < 0.6
            if strike:
                strike_within(rng, flush_time)
                done = persisted_line(mesh.text(), target)
                mesh.kill()
                kills += 1
                for p in pp:   # a rank cut off would retry its connect until SNAP_TIMEOUT_MS
                    p.kill()
                    p.wait()
                check_restored(t, procs, target, killed=True)
                on_disk = persisted_steps([disk])
                cut += target not in on_disk
                print(f"trial {t}: node {lost} lost, mesh killed {'after' if done else 'during'} the relaunch's "
                      f"flush of {target}; persisted now {on_disk}", flush=True)
                if done and target not in on_disk:
                    fail(f"trial {t}: step {target} logged persisted but not whole on disk")
                # The next relaunch (nothing lost) must finish what the kill cut.
                mesh.start(os.path.join(logdir, f"mesh{t}k.log"))
                procs = start_trainers(a, mesh, logdir, f"t{t}k", target, env_over=OWN)
                pp = [p for p, _, _ in procs]
                was = target in on_disk
                if not waiter.until(lambda: persisted_line(mesh.text(), target) or was, procs=[mesh.proc]):
                    fail(f"trial {t}: the relaunch after the kill did not persist step {target}; see {mesh.log}")
                if was and NOW in mesh.text():
                    fail(f"trial {t}: step {target} was persisted, yet the relaunch flushed it again; see {mesh.log}")
            elif not waiter.until(lambda: persisted_line(mesh.text(), target), procs=[mesh.proc]):
                fail(f"trial {t}: the relaunch's flush of step {target} did not finish; see {mesh.log}")
            else:
                flush_time = max(flush_time or 0, time.monotonic() - began)
                print(f"trial {t}: node {lost} lost; step {target} persisted by the relaunch "
                      f"({flush_time:.2f} s)", flush=True)
            for p in pp:
                p.wait()
            check_restored(t, procs, target, killed=False)
            if target not in persisted_steps([disk]):
                fail(f"trial {t}: step {target} not whole on disk after the relaunch; see {mesh.log}")
            mesh.kill()

        # ---- every store lost: the disk holds what the relaunches wrote ----
        if not failures:
            for n in range(a.nodes):
                shutil.rmtree(mesh.root(n), ignore_errors=True)
            mesh.start(os.path.join(logdir, "final.log"))
            procs = start_trainers(a, mesh, logdir, "final", step, env_over=OWN)
            for p, _, _ in procs:
                p.wait()
            check_restored("final", procs, step, killed=False)
            if "(level: disk)" not in mesh.text():
                fail(f"final: the ranks did not restore from the disk; see {mesh.log}")
            mesh.kill()
            if mesh.sanitizer_errors():
                fail(f"final: a sanitizer report in {mesh.log}")
        if not kills and not failures:
            fail(f"no trial struck inside the relaunch's flush (seed {seed}): raise --trials")
    finally:
        mesh.kill()
        waiter.close()
    if failures:
        print(f"mesh_relaunch_flush: {len(failures)} failures (seed {seed}); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print(f"mesh_relaunch_flush: ok, {kills} kill(s) inside the relaunch's flush, {cut} before it was whole on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
