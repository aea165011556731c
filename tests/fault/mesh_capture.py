#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Captured files (LD_PRELOAD) across an erasure-coded mesh (issue 13), with
real processes: `mpirun -np NODES snapsmp --ec K+M --flush-files 0`, so a
captured file lives only in the nodes' memory, and on every node an
unmodified C program (pl_writer: write, pwrite, fsync, rename, unlink) under
the preload, checkpointing into that node's own captured directory.

Quiet phase (the issue's survival test): every writer writes its checkpoints
and exits; the test waits until every node logs a generation holding its
final files, SIGKILLs the whole mesh, deletes the stores of M random nodes of
every group and relaunches. Every node's directory must then read, under the
preload, the same files byte for byte as before the loss (the lost nodes'
rebuilt from parity), while the real directories are still empty.

Busy trials: the writers keep checkpointing. The test notes each writer's
last committed step c, waits until its node has protected two more
generations (the second began after c's commit), then measures the time
between generations and SIGKILLs the writers and the whole mesh at a random
moment within one. Up to M nodes per group lose their stores, and sometimes a byte
of a survivor's protected data is flipped or its catalog truncated (that
node must then be rebuilt as lost). After the relaunch, on every node:
no torn or wrong file (pl_writer check), the newest checkpoint the store
names is not older than c, the flipped byte is repaired, and the writer resumes from it.

Finally SIGTERM: every node flushes its captured files and exits 0, and
the real directories hold what the store held, read without the preload.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

from events import Waiter, strike_within
from mesh_trials import Mesh, daemon_status, groups_of, setup

JOB = "pc"


def protected_gens(text, nodes):
    """Per node: the captured-file generations it logged as protected."""
    gens = [[] for _ in range(nodes)]
    for m in re.finditer(r"node (\d+): job " + JOB + r" captured files generation (\d+) protected \(", text):
        if int(m.group(1)) < nodes:
            gens[int(m.group(1))].append(int(m.group(2)))
    return gens


def parity_files_of(text, nodes):
    """Per node: how each protected generation got its parity file, in order
    ("new", or "reused": the spare the generation before the last left)."""
    how = [[] for _ in range(nodes)]
    for m in re.finditer(r"node (\d+): job " + JOB + r" captured files generation \d+ protected \([^)]*parity file (\w+)",
                         text):
        if int(m.group(1)) < nodes:
            how[int(m.group(1))].append(m.group(2))
    return how


def catalog_names(path):
    """The base names of the files a generation's catalog lists (the layout of
    smp/mesh/capgen.c: a 24-byte header, then per file u32 path length, u32
    manifest length, u64 size, the path and manifest padded to 8), or None
    while it cannot be read (pruned by a newer generation)."""
    try:
        with open(path, "rb") as f:
            b = f.read()
    except OSError:
        return None
    if len(b) < 24 or b[:8] != b"SNAPCAT1":
        return None
    names, q = [], 24
    for _ in range(int.from_bytes(b[8:12], "little")):
        pl, ml = int.from_bytes(b[q:q + 4], "little"), int.from_bytes(b[q + 4:q + 8], "little")
        names.append(os.path.basename(b[q + 16:q + 16 + pl].decode(errors="replace")))
        q += 16 + (pl + ml + 7) // 8 * 8
    return sorted(names)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="4+2")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--bytes", type=int, default=256 << 10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    base, logdir = setup(a, "snaptest-meshcap")
    preload = os.path.abspath(os.path.join(a.build, "integration", "libsnap_preload.so"))
    writer = os.path.join(a.build, "tests", "preload", "pl_writer")
    disk = f"/tmp/snaptest-meshcap-disk-{os.getpid()}"
    shutil.rmtree(disk, ignore_errors=True)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    groups = groups_of(a.nodes, a.k, a.m)
    print(f"mesh_capture: {a.shape} nodes={a.nodes} groups={groups} trials={a.trials} seed={seed}", flush=True)
    mesh = Mesh(a, base, ["--flush-files", "0"])
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def cdir(n):
        return os.path.join(disk, f"n{n}")

    def env(n, with_preload=True):
        e = dict(os.environ, SNAP_STORE=mesh.root(n), SNAP_CAPTURE=cdir(n), SNAP_JOB=JOB, SNAP_TIMEOUT_MS="5000",
                 ASAN_OPTIONS="detect_leaks=0")
        e.pop("LD_PRELOAD", None)
        if with_preload:
            e["LD_PRELOAD"] = preload
        return e

    def check(n, with_preload=True):
        r = subprocess.run([writer, "check", cdir(n), str(a.bytes)], env=env(n, with_preload), capture_output=True,
                           text=True, timeout=300)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"newest": -1, "bad": [r.stdout + r.stderr], "names": []}

    def start_writers(tag, steps):
        out = []
        for n in range(a.nodes):
            log = os.path.join(logdir, f"{tag}-w{n}.log")
            f = open(log, "w")
            p = subprocess.Popen([writer, "run", cdir(n), str(a.bytes), str(steps)], env=env(n), stdout=f,
                                 stderr=subprocess.STDOUT)
            f.close()
            out.append((p, log))
        return out

    def last_committed(log):
        with open(log, errors="replace") as f:
            steps = [int(x) for x in re.findall(r"^committed (\d+)$", f.read(), re.M)]
        return steps[-1] if steps else -1

    def store_newest(n):
        """The newest checkpoint the node's store itself names (its namespace
        tree), not counting files the preload wrote to the real directory
        while no snapsmp answered (its fallback)."""
        ns = os.path.join(mesh.root(n), JOB, "files", "ns", cdir(n).lstrip("/"))
        steps = [int(x[5:]) for x in (os.listdir(ns) if os.path.isdir(ns) else []) if re.fullmatch(r"ckpt-\d+", x)]
        return max(steps, default=-1)

    def budget_wrong(n, spare):
        """None when node n's count against its budget equals what its
        files hold: captured data by pages, and every parity file of the
        job (the protected generation's, and the spare when `spare`); else
        why not."""
        st = daemon_status(a, mesh.root(n))
        if isinstance(st, str):
            return f"node {n}: {st}"
        files = os.path.join(mesh.root(n), JOB, "files")
        held = 0
        for f in os.listdir(os.path.join(files, "data")):
            held += (os.path.getsize(os.path.join(files, "data", f)) + 4095) // 4096 * 4096
        ec = sorted(f for f in os.listdir(os.path.join(files, "ec")) if not f.endswith(".rec") and
                    os.path.isfile(os.path.join(files, "ec", f)))
        held += sum(os.path.getsize(os.path.join(files, "ec", f)) for f in ec)
        want = [next((f for f in ec if re.fullmatch(r"step-\d+\.parity", f)), "step-?.parity")]
        if ec != sorted(want + ["spare.parity"] * spare):
            return f"node {n}: {files}/ec holds {ec}: expected the protected generation's parity file" + \
                (" and the spare" if spare else "")
        if st["daemon_mem_used"] != held:
            return f"node {n}: the daemon counts {st['daemon_mem_used']} bytes, its files hold {held} (ec: {ec})"
        return None

    def lose(trial):
        """M random nodes of each group (sometimes fewer) lose their stores."""
        lost = []
        for g in groups:
            lost += rng.sample(g, rng.randint(1, a.m) if trial else a.m)
        for n in lost:
            shutil.rmtree(mesh.root(n), ignore_errors=True)
        return sorted(lost)

    def flip(lost):
        """Damage a survivor's newest protected generation: flip a byte of its
        data (the rebuild repairs the chunk in place), or truncate its catalog
        (the node must count as lost for that generation and be rebuilt).
        Returns (path, "data" | "catalog") or None."""
        def ec(n):
            return os.path.join(mesh.root(n), JOB, "files", "ec")

        # a survivor of a group that lost fewer than m: one more erasure is rebuildable
        survivors = [n for g in groups if len(set(g) & set(lost)) < a.m for n in g if n not in lost]
        if not survivors:
            return None
        # the newest generation every survivor has a record of: the one the relaunch rebuilds
        gens = set.intersection(*[{int(r[5:-4]) for r in os.listdir(ec(n)) if r.startswith("step-") and
                                   r.endswith(".rec")} if os.path.isdir(ec(n)) else set() for n in survivors])
        if not gens:
            return None
        g = max(gens)
        if rng.random() < 0.4:
            p = os.path.join(ec(rng.choice(survivors)), f"g-{g}", "catalog")
            os.truncate(p, os.path.getsize(p) // 2)
            return p, "catalog"
        cands = [p for n in survivors for p in glob.glob(os.path.join(ec(n), f"g-{g}", "*"))
                 if not p.endswith("catalog") and os.path.getsize(p) > 0]
        if not cands:
            return None
        p = rng.choice(cands)
        with open(p, "r+b") as f:
            off = rng.randrange(os.path.getsize(p))
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))
        return p, "data"

    try:
        for n in range(a.nodes):
            os.makedirs(cdir(n))
        # ---- quiet: the survival test ----
        mesh.start(os.path.join(logdir, "mesh-q0.log"))
        ws = start_writers("q", 5)
        for p, log in ws:
            if p.wait(timeout=300) != 0:
                fail(f"quiet writer exited {p.returncode}; see {log}")
        before = [check(n) for n in range(a.nodes)]
        # every node's newest protected generation lists its final checkpoints
        # (a count of files is not enough: the writer keeps two, so an older
        # generation holding ckpt-1 and ckpt-2 has as many)
        def final_protected():
            newest = [max(x, default=-1) for x in protected_gens(mesh.text(), a.nodes)]
            return all(g >= 0 and sorted(before[n]["names"]) ==
                       catalog_names(os.path.join(mesh.root(n), JOB, "files", "ec", f"g-{g}", "catalog"))
                       for n, g in enumerate(newest))

        if not waiter.until(final_protected, limit=120):
            fail(f"quiet: not every node protected its final files; see {mesh.log}")
        # A generation writes into the parity file of the one before the
        # protected one (the spare): a node's first two make theirs, every
        # later one reuses. A node keeps the protected generation's parity
        # file and the spare, and its budget counts exactly those.
        spares = {}
        for n, how in enumerate(parity_files_of(mesh.text(), a.nodes)):
            if any(h != "new" for h in how[:2]) or any(h != "reused" for h in how[2:]):
                fail(f"quiet: node {n}'s generations took their parity files as {how}: expected two new, then "
                     f"reused; see {mesh.log}")
            if not waiter.until(lambda: budget_wrong(n, len(how) >= 2) is None, limit=60):
                fail(f"quiet: {budget_wrong(n, len(how) >= 2)}")
            if len(how) >= 2:
                spares[n] = os.path.getsize(os.path.join(mesh.root(n), JOB, "files", "ec", "spare.parity"))
        mesh.kill()
        lost = lose(0)
        mesh.start(os.path.join(logdir, "mesh-q1.log"))
        for n in range(a.nodes):
            after = check(n)
            if sorted(after["names"]) != sorted(before[n]["names"]) or after["bad"] or after["newest"] != 4:
                fail(f"quiet: node {n}{' (lost)' if n in lost else ''} reads {after}, before the loss {before[n]}")
            if os.listdir(cdir(n)):
                fail(f"quiet: {cdir(n)} holds {os.listdir(cdir(n))} with --flush-files 0: not served from the store")
        if len(re.findall(r"captured files generation \d+: rebuilt this lost node", mesh.text())) != len(lost):
            fail(f"quiet: {len(lost)} lost nodes but the log shows another number of rebuilds; see {mesh.log}")
        # The lost nodes' namespaces came back: a generation follows. The
        # survivors kept their spare across the relaunch and reuse it,
        # resized to this generation's parity, within the budget; a lost
        # node counts its rebuilt generation's parity too (the start counts
        # every job directory's parity, not only the store's jobs).
        if not waiter.until(lambda: all(parity_files_of(mesh.text(), a.nodes)), limit=120):
            fail(f"quiet: no generation after the relaunch on every node; see {mesh.log}")
        for n, how in enumerate(parity_files_of(mesh.text(), a.nodes)):
            if n in spares and n not in lost and how[:1] != ["reused"]:
                fail(f"quiet: survivor {n}'s first generation after the relaunch took its parity file as {how[:1]}, "
                     f"not the spare it kept ({spares[n]} bytes); see {mesh.log}")
            # the kept generation became the spare; a generation under way
            # (its log line comes once the budget counts it) is waited for
            if not waiter.until(lambda: budget_wrong(n, True) is None, limit=60):
                fail(f"quiet, after the relaunch: {budget_wrong(n, True)}")
        print(f"quiet: lost nodes {lost}, every node reads its {len(before[0]['names'])} files back", flush=True)

        # ---- busy trials ----
        for t in range(1, a.trials + 1):
            ws = start_writers(f"b{t}", 10**6)
            pp = [p for p, _ in ws]
            # c: each writer's committed step, then two more generations everywhere
            if not waiter.until(lambda: all(last_committed(log) >= 0 for _, log in ws), procs=pp):
                fail(f"trial {t}: a writer committed nothing; see {logdir}")
            c = [last_committed(log) for _, log in ws]
            c0 = [len(x) for x in protected_gens(mesh.text(), a.nodes)]
            began = time.monotonic()
            if not waiter.until(lambda: all(len(x) >= y + 2 for x, y in zip(protected_gens(mesh.text(), a.nodes), c0)),
                                procs=pp):
                fail(f"trial {t}: no two generations were protected while the writers ran; see {mesh.log}")
            gen_time = (time.monotonic() - began) / 2
            strike_within(rng, gen_time)
            # The writers first: one that outlived its snapsmp would go on
            # writing to the real directory (the preload's fallback) and
            # delete the store's older files itself; that is tested in
            # preload.fallback, here the store alone must hold the files.
            for p in pp:
                p.kill()
            mesh.kill()
            for p in pp:
                p.wait()
            lost = lose(t)
            flipped = flip(lost) if rng.random() < 0.5 else None
            mesh.start(os.path.join(logdir, f"mesh-b{t}.log"))
            for n in range(a.nodes):
                r = check(n)
                if r["bad"]:
                    fail(f"trial {t}: node {n}{' (lost)' if n in lost else ''}: torn or wrong files {r['bad']}")
                if store_newest(n) < c[n]:
                    fail(f"trial {t}: node {n}{' (lost)' if n in lost else ''}: the store's newest checkpoint "
                         f"{store_newest(n)} is older than {c[n]}, committed before a generation that was protected")
            text = mesh.text()
            if flipped and flipped[1] == "data" and "1 corrupt" not in text:
                fail(f"trial {t}: a byte of {flipped[0]} was flipped but no rebuild repaired it; see {mesh.log}")
            if flipped and flipped[1] == "catalog" and (
                    not re.search(r"unusable \(the catalog's length or CRC32C", text) or
                    len(re.findall(r"captured files generation \d+: rebuilt this lost node", text)) != len(lost) + 1):
                fail(f"trial {t}: {flipped[0]} was truncated but that node was not rebuilt as lost; see {mesh.log}")
            print(f"trial {t}: lost {lost}{', damaged ' + flipped[1] if flipped else ''}, "
                  f"after {gen_time:.3f} s; every node reads whole files, none older than c={c}", flush=True)
        # every node's generations reused the spare (the busy trials have
        # two or more generations each)
        reused = [0] * a.nodes
        for log in glob.glob(os.path.join(logdir, "mesh-*.log")):
            with open(log, errors="replace") as f:
                for n, how in enumerate(parity_files_of(f.read(), a.nodes)):
                    reused[n] += how.count("reused")
        if not all(reused):
            fail(f"no generation reused its parity file on some node: {reused}; see {logdir}")
        # the writers resume from the store (and the files are whole)
        ws = start_writers("resume", 2)
        for (p, log), n in zip(ws, range(a.nodes)):
            if p.wait(timeout=300) != 0:
                fail(f"resume: writer {n} exited {p.returncode}; see {log}")
        final = [check(n) for n in range(a.nodes)]
        rc = mesh.stop()
        if rc != 0:
            fail(f"SIGTERM: the mesh exited {rc}; see {mesh.log}")
        for n in range(a.nodes):
            disk_view = check(n, with_preload=False)
            if sorted(disk_view["names"]) != sorted(final[n]["names"]) or disk_view["bad"] or disk_view["newest"] != final[n]["newest"]:
                fail(f"SIGTERM flush: node {n}'s real directory reads {disk_view}, the store {final[n]}")
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    finally:
        mesh.kill()
        waiter.close()
    if failures:
        print(f"mesh_capture: {len(failures)} failure(s); logs in {logdir}, seed {seed}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(disk, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print(f"mesh_capture: OK ({a.trials} busy trials and the quiet loss, seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
