#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap.torch's memory stays bounded save after save.

One rank of the real training job (tests/python/train.py --libsnap
--no-history: model, AdamW state, schedule and generators saved every step
through snapsmp) stops itself after committing steps 61 and 301
(TRAIN_PAUSE_AT), and is read from /proc while stopped: anonymous resident
memory (RssAnon), VmData, descriptors, threads (io_uring's kernel workers
aside); snapsmp with it. Between the two, 240 saves: none may grow beyond a
small allowance (a tensor, a buffer or a pickled copy kept per save would).
The rank collects cyclic garbage before it stops (torch's StepLR makes a
class per step). Measured on the gcc build: the trainer +288 KiB over 840
saves and +584 KiB over 240 (the allocator, not a growth per save),
snapsmp +0.
usage: check_memory_torch.py BUILD SRC
"""
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from checks import Checks  # noqa: E402
from events import Waiter, free_port, wait_socket  # noqa: E402
from procstat import sample  # noqa: E402

BUILD, SRC = sys.argv[1:3]
FIRST, LAST = 61, 301
ALLOW = {"trainer": 1 << 20, "snapsmp": 192 << 10}
check = Checks()


def logged(log, line):
    try:
        with open(log) as f:
            return any(ln.strip() == line for ln in f)
    except FileNotFoundError:
        return False


def main():
    store = f"/dev/shm/snaptest-pymem-{os.getpid()}"
    work = os.path.join(BUILD, "tests", "python", f"memory-{os.getpid()}")
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    no_quarantine = "quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
    asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), no_quarantine]))
    # Under ASan the trainer (Python) needs the sanitizer runtime preloaded
    # (CMakeLists.txt); snapsmp carries its own.
    smp = subprocess.Popen([os.path.join(BUILD, "smp", "snapsmp"), "--store", store, "--quiet"],
                           env=dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, ASAN_OPTIONS=asan))
    log = os.path.join(work, "r0.log")
    try:
        if not check(wait_socket(store, smp), "snapsmp started"):
            return 1
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0",
                   SNAP_STORE=store, SNAP_JOB="pymem", SNAP_TIMEOUT_MS="60000", SNAP_COPY_THREADS="1",
                   PYTHONPATH=os.path.join(SRC, "integration", "python"), OMP_NUM_THREADS="1",
                   TRAIN_PAUSE_AT=f"{FIRST},{LAST}", ASAN_OPTIONS="detect_leaks=0:" + no_quarantine)
        data = [os.path.join(SRC, "docs", "design", "mesh-and-ec.md"), os.path.join(SRC, "README.md")]
        with open(os.path.join(work, "r0.err"), "w") as err:
            p = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"),
                                  "--libsnap", "--no-history", "--steps", str(LAST + 2), "--log", log,
                                  "--data", *data], env=env, stdout=err, stderr=err)
        at = []
        w = Waiter()
        try:
            for step in (FIRST, LAST):
                ok = w.until(lambda: logged(log, f"paused {step}"), limit=600, dirs=lambda: [work], procs=[p])
                if not check(ok and p.poll() is None, f"the trainer paused after step {step}"):
                    break
                _, st = os.waitpid(p.pid, os.WUNTRACED)   # until the stop took effect
                if not check(os.WIFSTOPPED(st), f"the trainer stopped after step {step}: status {st}"):
                    break
                # snapsmp too: the rank's requests were all answered (its
                # commit waited for), and snapsmp has no flush directory here.
                at.append({"trainer": sample(p.pid), "snapsmp": sample(smp.pid)})
                p.send_signal(signal.SIGCONT)
        finally:
            w.close()
            rc = p.wait(timeout=600)
        check(rc == 0, f"the trainer finished: exit {rc}; see {os.path.join(work, 'r0.err')}")
        if len(at) == 2:
            for who in ("trainer", "snapsmp"):
                check.growth("", who, at[0][who], at[1][who], LAST - FIRST, ALLOW[who], "saves")
    finally:
        if smp.poll() is None:
            smp.terminate()
        check(smp.wait(timeout=120) == 0, "snapsmp stopped cleanly")
        shutil.rmtree(store, ignore_errors=True)
    return check.result(work)


if __name__ == "__main__":
    sys.exit(main())
