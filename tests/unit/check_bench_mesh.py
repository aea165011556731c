#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`snaptool bench mesh` (snapbench mesh: erasure coding through the real
daemons) at its smallest size, and what it must do when things go wrong.

1. A 2+1 mesh, 4 MiB per node, 5 steps, --json: every step protected, the
   lost node rebuilt, every rank's bytes checked by a new process, every
   figure present and positive (the CPU seconds per GB included: the log
   lines they are read from carry them); no figure is compared with a target (a
   benchmark, not a timed test). Nothing is left behind: no store under
   --dir, no log, no process.
2. Bad input is refused before anything starts, naming the option: a size
   with an unknown suffix, too few steps, a mesh the group shape refuses, a
   --dir that does not exist.
3. Three runs SIGINTed, each at a log line picked at random (a step
   committed everywhere, a step protected, the lost node rebuilt): exit 1
   saying so, and the mesh, the trainers, the stores and the log are all
   gone.
4. A trainer, then a daemon, SIGKILLed at the log line of a step protected
   (picked at random among the saves): exit 1 naming what died (a dead
   trainer used to leave the run waiting 600 s for its report, or kill it
   with SIGPIPE and leave the mesh running), the mesh, the other trainers
   and the stores gone, the daemons' log kept and named.
usage: check_bench_mesh.py SNAPTOOL
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter  # noqa: E402

snaptool = sys.argv[1]
rng = random.Random(int(os.environ.get("SNAP_TEST_SEED", "57")))
tmp = tempfile.mkdtemp(prefix="benchmesh.")
stores = os.path.join(tmp, "stores")
os.mkdir(stores)
env = dict(os.environ, TMPDIR=tmp, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
# Open MPI's allocations are reported as leaks by LeakSanitizer (as in tests/ec)
env["ASAN_OPTIONS"] = ",".join(x for x in (os.environ.get("ASAN_OPTIONS"), "detect_leaks=0") if x)


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def leftovers(pid):
    """What a run of snapbench `pid` might leave: its store folder, its log,
    processes whose command line names either."""
    base = os.path.join(stores, f"snapbench-mesh-{pid}")
    log = os.path.join(tmp, f"snapbench-mesh-{pid}.log")
    left = [p for p in (base, log) if os.path.exists(p)]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if base in cmd:
                left.append(f"pid {d}: {cmd}")
    return left


def bench(*args):
    return subprocess.Popen([snaptool, "bench", "mesh", "--dir", stores, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def bench_until(pat, what, *args):
    """Start a run and wait (inotify) until its daemons' log shows /pat/:
    the run and its log's path; fails the test if the line never comes."""
    p = bench(*args)
    log = os.path.join(tmp, f"snapbench-mesh-{p.pid}.log")

    def seen():
        try:
            with open(log, errors="replace") as f:
                return re.search(pat, f.read()) is not None
        except FileNotFoundError:
            return False

    w = Waiter()
    w.watch(tmp)
    hit = w.until(seen, limit=300, procs=[p])
    w.close()
    if not hit:
        p.kill()
        fail(f"{what}: /{pat}/ never appeared (exit {p.wait()}): {p.stderr.read()}")
    return p, log


try:
    # 1. a whole run
    p = bench("--k", "2", "--m", "1", "--size", "4M", "--steps", "5", "--json")
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        fail(f"bench mesh exited {p.returncode}: {out[-2000:]} {err[-2000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    want = ("protect_gbps", "protect_cold_gbps", "protect_steady_s", "save_to_protected_s", "commit_s",
            "rebuild_s", "rebuild_gbps", "relaunch_to_serving_s", "relaunch_to_restored_s", "restore_s",
            "protect_vs_mpi_move", "rebuild_vs_raw_decode", "cores", "protect_cpu_s_per_gb", "rebuild_cpu_s_per_gb",
            "protect_vs_mpi_move_cpu_ceiling", "rebuild_vs_raw_decode_cpu_ceiling", "protect_cpu_vs_library",
            "rebuild_cpu_vs_library", "rebuild_cpu_vs_library_fresh", "rebuild_lost_nodes_cpu_s_per_gb")
    bad = [k for k in want if not (isinstance(r.get(k), (int, float)) and r[k] > 0)]
    lib = r.get("library") or {}
    bad += [f"library.{k}" for k in ("mpi_move_gbps", "raw_encode_gbps", "mesh_encode_gbps", "raw_decode_gbps",
                                     "rebuild_gbps", "mpi_move_cpu_s_per_gb", "mesh_encode_cpu_s_per_gb",
                                     "rebuild_cpu_s_per_gb", "raw_decode_cpu_s_per_gb",
                                     "rebuild_fresh_cpu_s_per_gb") if not (isinstance(lib.get(k), (int, float)) and lib[k] > 0)]
    if bad or r.get("steps") != 5 or r.get("nodes") != 3 or r.get("lost_nodes") != [0] \
            or r.get("protected_bytes", 0) < 3 * (4 << 20) or r.get("restored_bytes_checked") != 3 * (4 << 20) \
            or len(r.get("protect_cold_s", [])) != 4:
        fail(f"bench mesh reported {r}; missing or not positive: {bad}")
    if not r.get("rebuild_lost_nodes_cpu_s_per_gb", 0) < r["rebuild_cpu_s_per_gb"]:
        fail(f"the lost node's rebuild CPU ({r.get('rebuild_lost_nodes_cpu_s_per_gb')}) must be a part of the "
             f"mesh's ({r['rebuild_cpu_s_per_gb']})")
    if r["save_to_protected_s"] < r["protect_steady_s"] * 0.5:
        fail(f"save -> protected ({r['save_to_protected_s']}) cannot be well under the daemons' own protect time "
             f"({r['protect_steady_s']})")
    if leftovers(p.pid):
        fail(f"a finished run left {leftovers(p.pid)}")
    print(f"bench mesh: protect {r['protect_gbps']:.2f} GB/s ({r['protect_vs_mpi_move']:.2f} of MPI move), "
          f"rebuild {r['rebuild_gbps']:.2f} GB/s, every field present, nothing left behind")

    # 2. bad input, refused by name before anything starts
    for args, code, says in ((["--size", "16Q"], 2, "--size 16Q"),
                             (["--steps", "3"], 2, "--steps 3"),
                             (["--k", "2", "--m", "1", "--nodes", "2"], 2, "--nodes 2 in groups of 2+1: need at least K+M"),
                             (["--k", "0"], 2, "--k 0"),
                             (["--dir", os.path.join(tmp, "absent")], 1, "absent")):
        q = subprocess.run([snaptool, "bench", "mesh", *args], env=env, capture_output=True, text=True, timeout=60)
        if q.returncode != code or says not in q.stderr:
            fail(f"bench mesh {' '.join(args)}: exit {q.returncode} (want {code}), stderr {q.stderr!r} "
                 f"(want it to name {says!r})")
    print("bad input: 5 cases refused, each naming what is wrong")

    # 3. SIGINT within a run, at an event picked at random: a step committed
    # everywhere (its protect starting), a step protected (the next save
    # starting), or the lost node rebuilt (the relaunched trainers starting).
    # The test waits for that log line (inotify) and strikes at once.
    steps = 8
    for trial in range(3):
        kind, step = rng.choice(("restorable", "protected", "rebuilt")), rng.randint(1, steps)
        pat = {"restorable": rf"node \d+: job bench step {step} restorable",
               "protected": rf"job bench step {step} protected",
               "rebuilt": rf"job bench step {steps}: rebuilt this lost node"}[kind]
        p, log = bench_until(pat, f"trial {trial}", "--k", "2", "--m", "1", "--size", "16M", "--steps", str(steps))
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        # the run may have finished between the line and the signal: then it exits 0
        if not (p.returncode == 1 and "stopped by signal 2" in err) and p.returncode != 0:
            fail(f"trial {trial}, SIGINT at /{pat}/: exit {p.returncode} (want 1), stderr {err!r}")
        left = leftovers(p.pid)
        if left:
            fail(f"trial {trial}, SIGINT at /{pat}/: the run left {left}")
        print(f"SIGINT at /{pat}/: exit {p.returncode}, mesh, trainers, stores and log all gone")

    # 4. a trainer or a daemon SIGKILLed mid-run
    def procs_of(pid):
        """The run's trainers (its forked children named snapbench) and
        daemons (snapsmp processes of its stores)."""
        base = os.path.join(stores, f"snapbench-mesh-{pid}")
        trainers, daemons = [], []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            comm, ppid = st[st.index("(") + 1:st.rindex(")")], int(st[st.rindex(")") + 2:].split()[1])
            if comm == "snapbench" and ppid == pid:
                trainers.append(int(d))
            elif comm == "snapsmp" and base in cmd:
                daemons.append(int(d))
        return trainers, daemons

    def alive(pid):
        """pid runs (not a zombie)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    for victim in ("trainer", "daemon"):
        step = rng.randint(1, steps - 2)
        pat = rf"job bench step {step} protected"
        p, log = bench_until(pat, f"{victim} trial", "--k", "2", "--m", "1", "--size", "16M", "--steps", str(steps))
        trainers, daemons = procs_of(p.pid)
        pool = trainers if victim == "trainer" else daemons
        if len(pool) != 3:
            p.kill()
            fail(f"{victim} trial at /{pat}/: found {len(pool)} {victim}s of run {p.pid}, want 3")
        os.kill(rng.choice(pool), signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            # the mesh (mpiexec names the stores) is in a session of its own
            for pid in trainers + [int(x.split(":")[0][4:]) for x in leftovers(p.pid) if x.startswith("pid ")]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            fail(f"a {victim} SIGKILLed at /{pat}/: the run did not notice within 120 s")
        says = (r"the trainer of rank \d+ (was killed by signal 9|is gone)" if victim == "trainer"
                else r"the mesh died|rank \d+ failed at step \d+")
        if p.returncode != 1 or not re.search(says, err) or f"the daemons' log is kept: {log}" not in err:
            fail(f"a {victim} SIGKILLed at /{pat}/: exit {p.returncode} (want 1), stderr {err!r} "
                 f"(want /{says}/ and the log named)")
        left = leftovers(p.pid) + [f"trainer pid {t}" for t in trainers if alive(t)]
        if left != [log]:
            fail(f"a {victim} SIGKILLed at /{pat}/: left {left} (want the log {log} alone)")
        os.unlink(log)
        print(f"{victim} SIGKILLed at /{pat}/: exit 1, {re.search(says, err).group(0)!r}; "
              "mesh, trainers and stores gone, log kept")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print("check_bench_mesh: OK")
