#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Warm from the first step: a job's files are ready before its first protect
(smp/mesh/meshwarm.c, warmworker.c, slots.c), within the budget, and gone with the job.

A 2+1 mesh of 3 nodes, one rank per node (integration/trainer --prepare: the
layout is sent before the first step, then the trainer waits on a FIFO).
Event-driven: log lines, FIFOs, the metrics files.

  warm:     every node logs the job ready ahead of its first protects (slot
            files faulted in, two parity files made); only then do the
            trainers save steps 1-4. Steps 1 and 2 must read every slot
            through a mapping made ahead and write into parity made ahead
            (log lines and the metrics counters: no cold slot map or parity
            file), no save reserves its slot file itself, and the budget
            counts exactly the bytes in the files (pre-created ones included).
  relaunch: the trainers are relaunched against the same daemons with the
            same layout: every node reuses the rank's slot files (counter
            libsnap_slots_reused_total, log) and the rank restores step 4.
  gone:     a second job prepares (its pool made, its slots mapped) and its
            trainers are SIGKILLed before saving; its directories are removed
            under the running mesh: no daemon may keep any of its files
            mapped (their pages would outlive the job).
  budget:   a mesh whose budget holds the slots but not one parity file: no
            parity file is made ahead (logged), none exists in ec/, the
            daemons never count more than the budget, and the saves still
            commit (the protects fail on the budget as they always did).

usage: mesh_warm.py --build DIR [--shape 2+1] [--nodes 3] [--mpiexec P]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, budget_mismatch, daemon_status, mapped_store_files, restored_of, setup  # noqa: E402
from mesh_trials import start_trainers  # noqa: E402
from promfile import prom_value  # noqa: E402


def metric(path, name, job):
    """A counter's value for job in one node's metrics file, or None."""
    return prom_value(path, name, f'job="{job}"')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="2+1")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    a.world, a.bytes = 0, "256K"
    base, logdir = setup(a, "snaptest-meshwarm")
    a.world = a.nodes   # rank r on node r
    prom = os.path.join(logdir, "metrics-%n.prom")
    mesh = Mesh(a, base, extra=["--metrics-file", prom, "--metrics-interval", "1"])
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def fifos(tag):
        out = []
        for r in range(a.world):
            p = os.path.join(logdir, f"{tag}-go{r}")
            os.mkfifo(p)
            out.append(p)
        return out

    def go(paths):
        for p in paths:
            with open(p, "w") as f:   # the trainer has it open for reading: no wait here
                f.write("g")

    def count(pat):
        return len(re.findall(pat, mesh.text()))

    def prom_of(n):
        return prom.replace("%n", str(n))

    def wait_exit(procs, tag):
        for p, _, err in procs:
            if p.wait(timeout=300) != 0:
                fail(f"{tag}: a trainer exited {p.returncode}; see {err}")

    try:
        mesh.start(os.path.join(logdir, "mesh.log"))
        # ---- warm ----
        gos = fifos("warm")
        procs = []   # one call per rank: each waits on its own FIFO
        for r in range(a.world):
            procs += start_trainers(a, mesh, logdir, f"warm{r}", 4, ranks=[r], extra=["--go-fifo", gos[r]],
                                    env_over={"SNAP_LAUNCH": f"warm-{os.getpid()}"})
        ready = rf"job {JOB}: ready ahead of its first protects: \d+ slot file\(s\) faulted in, 2 parity file\(s\)"
        if not waiter.until(lambda: count(ready) >= a.nodes, procs=[p for p, _, _ in procs]):
            fail(f"warm: not every node logged job {JOB} ready ahead of its first protects; see {mesh.log}")
        msg = budget_mismatch(mesh, a)
        if msg:
            fail(f"warm: before the first save, with files made ahead: {msg}")
        pool = glob.glob(os.path.join(base, "node*", JOB, "ec", "warm-*.parity"))
        if len(pool) != 2 * a.nodes:
            fail(f"warm: {len(pool)} parity files made ahead, expected 2 per node: {sorted(pool)}")
        go(gos)
        done = rf"job {JOB} step 4 protected \("
        if not waiter.until(lambda: count(done) >= a.nodes, procs=[p for p, _, _ in procs]):
            fail(f"warm: step 4 was not protected on every node; see {mesh.log}")
        wait_exit(procs, "warm")
        # The mesh protects the newest complete step, so the first two
        # protects may be of any of steps 1-4: each must be warm.
        first = re.findall(rf"job {JOB} step (\d+) protected \(", mesh.text())
        first = sorted(set(int(x) for x in first))[:2]
        for s in first:
            line = rf"job {JOB} step {s}: slot files read first through mappings made ahead 1, mapped by this " \
                   rf"protect 0; parity file: made ahead"
            if count(line) != a.nodes:
                fail(f"warm: step {s}, one of the first two protected: {count(line)} of {a.nodes} nodes "
                     f"protected it from files made ahead; see {mesh.log}")
        if count(r"mapped by this protect [1-9]") or count(r"parity file: new"):
            fail(f"warm: a protect mapped a slot file or created its parity file itself; see {mesh.log}")
        msg = budget_mismatch(mesh, a)
        if msg:
            fail(f"warm: after the protects: {msg}")

        # the counters, from each node's metrics file (rewritten every second)
        nprot = len(set(re.findall(rf"job {JOB} step (\d+) protected \(", mesh.text())))
        want = {"libsnap_slots_precreated_total": 3, "libsnap_slots_late_total": 0,
                "libsnap_slots_prefaulted_total": 3, "libsnap_slot_maps_cold_total": 0, "libsnap_parity_precreated_total": 2,
                "libsnap_parity_cold_total": 0, "libsnap_parity_warm_total": nprot}

        # Slots first read through a mapping made ahead: one per protect
        # until each of the 3 has been read (which slot a save takes is the
        # store's choice: a slot never protected is first read later).
        warm_key = "libsnap_slot_maps_warm_total"

        def counters_ok():
            return all(metric(prom_of(n), k, JOB) == v for n in range(a.nodes) for k, v in want.items()) and \
                all(min(nprot, 2) <= (metric(prom_of(n), warm_key, JOB) or 0) <= 3 for n in range(a.nodes))
        if not waiter.until(counters_ok, limit=60):
            got = {n: {k: metric(prom_of(n), k, JOB) for k in list(want) + [warm_key]} for n in range(a.nodes)}
            fail(f"warm: metrics {got}, expected {want} and {warm_key} 2..3 ({nprot} protects)")
        print(f"warm: {nprot} protects, the first two from files made ahead on {a.nodes} nodes; counters {want}",
              flush=True)

        # ---- relaunch of the job, same daemons, same layout ----
        procs = start_trainers(a, mesh, logdir, "again", 6)
        wait_exit(procs, "relaunch")
        got = [restored_of(log) for _, log, _ in procs]
        if got != [4] * a.world:
            fail(f"relaunch: the ranks restored {got}, expected step 4 everywhere")
        reused = rf"job {JOB} rank \d+: 3 slot file\(s\) of \d+ bytes reused, 0 being reserved"
        if count(reused) != a.nodes:
            fail(f"relaunch: {count(reused)} of {a.nodes} nodes logged the rank's 3 slot files reused; see {mesh.log}")
        if not waiter.until(lambda: all(metric(prom_of(n), "libsnap_slots_reused_total", JOB) == 3
                                        for n in range(a.nodes)) and
                            all(metric(prom_of(n), "libsnap_slots_late_total", JOB) == 0
                                for n in range(a.nodes)), limit=60):
            fail("relaunch: libsnap_slots_reused_total is not 3 (or a save reserved its slot) on every node")
        print("relaunch: every rank reused its 3 slot files and restored step 4", flush=True)

        # ---- gone: a job removed before its first save ----
        gos = fifos("gone")
        procs = []
        for r in range(a.world):
            procs += start_trainers(a, mesh, logdir, f"gone{r}", 2, ranks=[r], extra=["--go-fifo", gos[r]],
                                    env_over={"SNAP_JOB": "gone", "SNAP_LAUNCH": f"gone-{os.getpid()}"})
        ready_gone = r"job gone: ready ahead of its first protects"
        if not waiter.until(lambda: count(ready_gone) >= a.nodes, procs=[p for p, _, _ in procs]):
            fail(f"gone: not every node made job gone's files ready; see {mesh.log}")

        def mapped():
            return [f for f in mapped_store_files(mesh) if "/gone/" in f]
        before = mapped()
        if not any("/ec/warm-" in f for f in before) or not any("/slot-" in f for f in before):
            fail(f"gone: the daemons map none of job gone's parity or slot files made ahead: {before}")
        for p, _, _ in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        for n in range(a.nodes):
            shutil.rmtree(os.path.join(mesh.root(n), "gone"))
        if not waiter.until(lambda: not mapped(), limit=60):
            fail(f"gone: 60 s after job gone's directories were removed, still mapped: {mapped()[:4]}")
        print(f"gone: {len(before)} mappings of a removed job's files made ahead were dropped", flush=True)
        mesh.kill()

        # ---- budget: no room for a parity file ----
        # slots: 3 x 266240 bytes (two 128 KiB regions and a page); parity of
        # one file: about 134 KiB. The budget holds the slots and 80 KB more.
        mesh2 = Mesh(a, os.path.join(base, "small"), extra=["--mem-limit", "880000"])
        os.makedirs(mesh2.base, exist_ok=True)
        mesh2.start(os.path.join(logdir, "mesh-small.log"))
        try:
            procs = start_trainers(a, mesh2, logdir, "small", 3, extra=["--prepare"])
            nobudget = rf"job {JOB}: no parity file created ahead of the first protects"
            if not waiter.until(lambda: len(re.findall(nobudget, mesh2.text())) >= a.nodes,
                                procs=[p for p, _, _ in procs]):
                fail(f"budget: not every node logged that the budget has no room for parity made ahead; "
                     f"see {mesh2.log}")
            wait_exit(procs, "budget")
            for n in range(a.nodes):
                st = daemon_status(a, mesh2.root(n))
                if isinstance(st, str):
                    fail(f"budget: node {n}: {st}")
                elif st["daemon_mem_used"] > 880000:
                    fail(f"budget: node {n} counts {st['daemon_mem_used']} bytes against a budget of 880000")
            if glob.glob(os.path.join(mesh2.base, "node*", JOB, "ec", "warm-*")):
                fail("budget: a parity file was made ahead beyond the budget")
            print("budget: nothing made ahead beyond the budget; the saves committed", flush=True)
        finally:
            mesh2.kill()
    finally:
        mesh.kill()
        waiter.close()
    if mesh.sanitizer_errors():
        fail(f"sanitizer report in {mesh.log}")
    if failures:
        print(f"{len(failures)} failure(s); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print("mesh_warm: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
