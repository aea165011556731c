#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Memory stays bounded save after save.

The top complaint about asynchronous checkpointing is memory that grows with
every save (pinned buffers, RSS). Here a 2-rank job (integration/examples/
trainer.c) saves hundreds of steps through snapsmp, which flushes every 5th
step to a real disk and keeps 2 (retention), in two configurations: LZ4 at
the flush (its chunks on the io_uring ring), and lossless codec frames made
by the copy threads at save time. A first launch runs WARM steps and exits;
a second resumes and runs MORE. The daemon is sampled after each launch,
once its log says the newest step is persisted (SIGUSR1) and each trainer
disconnected; each trainer of the second launch at two commit counts, three
times a commit apart (inotify on the logs: events, never a timer). A sample is the anonymous resident memory (RssAnon),
the open descriptors and the threads (from /proc), and for the daemon its
count against its budget. RssAnon may grow by at most the allowance (ALLOW)
over the measured steps: the daemon 64 KiB over 500 steps, so a leak of 132
bytes per step or more fails (the growth per step is printed); a trainer 64
KiB over 400 steps, 164 bytes per step. VmData may grow by that and two of
malloc's heap steps (procstat.HEAP_STEPS, 256 KiB): a block leaked and never
written (RssAnon does not see it) of 640 bytes per step or more fails. A descriptor
or a thread more per save or per flush fails too. The daemon's noise is
0-40 KiB over 500 steps (and no more over 3000): allocator settling, not a
leak per save.

--plant-leak SHIM BYTES proves the allowance: snapsmp runs with SHIM
(tests/smp/leak_shim.c) preloaded, leaking BYTES at each rename, one per
rank's commit (128 with 2 ranks: 256 bytes per step), in the lz4
configuration only; the script then exits 0 only if the daemon's growth
check failed, and every other check passed.

Under AddressSanitizer freed blocks wait in its quarantine and count as
resident: the check runs with the quarantine off (ASAN_OPTIONS), and the
daemon's allowance is 192 KiB (393 bytes per step).
usage: check_memory.py SNAPSMP SNAPTOOL TRAINER WORKDIR (on a disk: the flush goes there)
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from checks import Checks  # noqa: E402
from events import Waiter, wait_socket  # noqa: E402
from procstat import compare, sample, sanitized  # noqa: E402

SMP, SNAPTOOL, TRAINER, WORK = sys.argv[1:5]
PLANT = sys.argv[6:8] if len(sys.argv) == 8 and sys.argv[5] == "--plant-leak" else None
WARM, MORE = 100, 500
# Bytes of RssAnon (and of VmData) growth allowed over MORE steps (the
# daemon) and over MORE - 100 (a trainer): 131 and 164 bytes per step.
# Under AddressSanitizer its allocator settles higher (the daemon grew 36-60
# KiB over 500 steps): 192 KiB, 393 bytes per step; the gcc build catches
# the smaller leaks.
ALLOW = {"snapsmp": (192 if sanitized(SMP) else 64) << 10, "trainer": 64 << 10}
check = Checks()
planted_seen = []


def committed(log):
    n = 0
    try:
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0] == "committed" and parts[1].isdigit():
                    n = int(parts[1])
    except FileNotFoundError:
        pass
    return n


def status(store):
    p = subprocess.run([SNAPTOOL, "status", "--json", "--store", store], capture_output=True, text=True)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"snaptool status failed: {p.stdout!r} {p.stderr!r}"}


def logged_count(log, pattern):
    try:
        with open(log) as f:
            return len(re.findall(pattern, f.read()))
    except FileNotFoundError:
        return 0


def quiet(smp, store, log, ps, step):
    """The daemon's sample once it has nothing left to do for the launch
    that ended (ps): asked to flush its newest step (SIGUSR1: `step`, which
    --flush-every alone need not flush), it has logged that step persisted
    (the flush thread's files closed, retention done) and each trainer's
    disconnection (logged once the descriptor is closed); events in its
    log. Then snaptool status, asked after the sample (its own connection
    would be in it): no slot file may be being reserved, and the count
    against the budget. (None, message) if the events do not come."""
    smp.send_signal(signal.SIGUSR1)
    w = Waiter()
    try:
        ok = w.until(lambda: logged_count(log, rf"persisted step {step} of job mem:") >= 1 and
                     all(logged_count(log, rf"\(pid {p.pid}\) disconnected") >= 1 for p in ps),
                     limit=120, dirs=lambda: [os.path.dirname(log)], procs=[smp])
    finally:
        w.close()
    if not ok:
        return None, f"no 'persisted step {step}' and disconnection lines in {log}"
    now = sample(smp.pid)
    st = status(store)
    if st.get("daemon_reserving") != 0:
        return None, f"the daemon still reserves slot files with nothing to do: {st}"
    return now, st["daemon_mem_used"]


def settled(ps, logs, first):
    """The running trainers, each sampled three times, at its commit `first`
    or later and then each time it has committed again since (events in the
    logs), keeping each one's sample with the fewest descriptors: the client
    opens a slot file only while it maps it, so a descriptor in every sample
    is held, one in a single sample is passing. None for a trainer that
    stopped committing."""
    best, last = [None] * len(ps), [first - 1] * len(ps)
    w = Waiter()
    try:
        for _ in range(3):
            if not w.until(lambda: all(committed(log) > last[i] for i, log in enumerate(logs)), limit=300,
                           dirs=lambda: [os.path.dirname(logs[0])], procs=ps):
                return [None] * len(ps)
            for i, p in enumerate(ps):
                last[i] = committed(logs[i])
                try:
                    got = sample(p.pid)
                except OSError:
                    return [None] * len(ps)
                if best[i] is None or len(got["fds"]) < len(best[i]["fds"]):
                    best[i] = got
    finally:
        w.close()
    return best


def launch(store, work, env, trainer_env, name, upto, *args):
    logs = [os.path.join(work, f"{name}-r{r}.log") for r in range(2)]
    ps = [subprocess.Popen([TRAINER, "--steps", str(upto), "--bytes", "2M", "--quiet", "--log", logs[r], *args],
                           env=dict(env, SNAP_STORE=store, SNAP_JOB="mem", SNAP_RANK=str(r), SNAP_WORLD_SIZE="2",
                                    SNAP_LAUNCH=f"{name}-{os.getpid()}", **trainer_env)) for r in range(2)]
    return ps, logs


def run(name, smp_args, trainer_env):
    store = os.path.join("/dev/shm", f"snaptest-memory-{os.getpid()}-{name}")
    work = os.path.join(WORK, name)
    flush = os.path.join(work, "flush")
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "quarantine_size_mb=0",
                                                 "thread_local_quarantine_size_kb=0"]))
    log = os.path.join(work, "snapsmp.log")
    smp_env = dict(env, LD_PRELOAD=PLANT[0], SNAP_TEST_LEAK_BYTES=PLANT[1],
                   SNAP_TEST_LEAK_UNTOUCHED=os.environ.get("SNAP_TEST_LEAK_UNTOUCHED", "0")) if PLANT else env
    smp = subprocess.Popen([SMP, "--store", store, "--log", log, "--flush-dir", flush,
                            "--flush-every", "5", "--flush-keep", "2", *smp_args], env=smp_env)
    try:
        if not wait_socket(store, smp):
            check(False, f"{name}: snapsmp started")
            return
        # Warm-up: a first launch runs WARM steps and exits.
        ps, _ = launch(store, work, env, trainer_env, "warm", WARM)
        rcs = [p.wait(timeout=300) for p in ps]
        check(rcs == [0, 0], f"{name}: the warm-up launch ran (exit codes {rcs})")
        d0, used0 = quiet(smp, store, log, ps, WARM)
        check(d0 is not None, f"{name}: after the warm-up: {used0}")
        # The measured launch resumes and runs MORE steps; its trainers are
        # sampled at two commit counts (events), the daemon once it is done.
        ps, logs = launch(store, work, env, trainer_env, "more", WARM + MORE, "--resume")
        t = []
        for target in (WARM + 50, WARM + MORE - 50):
            got = settled(ps, logs, target)
            check(all(got), f"{name}: every rank committed {target} and twice more, alive "
                  f"(committed {[committed(log) for log in logs]})")
            t.append(got)
        rcs = [p.wait(timeout=300) for p in ps]
        check(rcs == [0, 0], f"{name}: the measured launch ran (exit codes {rcs})")
        d1, used1 = quiet(smp, store, log, ps, WARM + MORE)
        check(d1 is not None, f"{name}: after the measured launch: {used1}")
        if d0 and d1 and PLANT:
            line, problems = compare("snapsmp", d0, d1, MORE, ALLOW["snapsmp"])
            print(f"{name} (planted leak of {PLANT[1]} bytes per rename): {line}", flush=True)
            planted_seen.append(bool(problems))
            check(problems, f"{name}: the planted leak of {PLANT[1]} bytes per rename was not caught")
        elif d0 and d1:
            check.growth(name, "snapsmp", d0, d1, MORE, ALLOW["snapsmp"])
        for r in range(2):
            if t[0][r] and t[1][r]:
                check.growth(name, f"trainer {r}", t[0][r], t[1][r], MORE - 100, ALLOW["trainer"])
        print(f"{name}: the daemon counts {used0} -> {used1} bytes against its budget")
        check(used0 == used1, f"{name}: the daemon's count moved from {used0} to {used1} bytes")
        steps = [d for d in os.listdir(os.path.join(flush, "mem")) if d.startswith("step-")]
        check(len(steps) == 2, f"{name}: retention keeps 2 persisted steps: {sorted(steps)}")
    finally:
        if smp.poll() is None:
            smp.terminate()
        check(smp.wait(timeout=120) == 0, f"{name}: snapsmp stopped cleanly")
        shutil.rmtree(store, ignore_errors=True)


def main():
    run("lz4", ["--flush-codec", "lz4"], {})
    if PLANT:
        rc = check.result(WORK)
        print(f"planted leak caught: {planted_seen == [True]}")
        return rc
    run("frames", [], {"SNAP_CODEC_PARAM": "lossless", "SNAP_CODEC_OPTIM": "lossless"})
    return check.result(WORK)


if __name__ == "__main__":
    sys.exit(main())
