# SPDX-License-Identifier: BSD-3-Clause
"""snapsmp's log: levels, timestamps, destinations (--log-level/SNAP_LOG_LEVEL,
--log/SNAP_LOG, --quiet).

A real snapsmp with a flush directory serves the example trainer, which
commits two steps; `snaptool flush` persists one. Each run waits for the
event it looks for (the log file's line, the socket), never a duration:
  - info (the default), logging to a file: every line is
    "YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL snapsmp[PID]: ..." and the state
    changes are there, one line each: serving, the rank connected, the
    step flushed and persisted, the shutdown;
  - SNAP_LOG_LEVEL=debug on stderr: the effective settings, as debug lines,
    before the info lines;
  - --log-level warn and --quiet: no info line at all, a clean exit;
  - a bad level (flag or variable) and a log file that cannot be created:
    exit 2 naming the setting;
  - --flush-direct 0 and the default: the persisted line says "through the
    page cache" and "O_DIRECT" (where the directory allows O_DIRECT).
syslog is not exercised (no syslog daemon here).
usage: check_log.py SNAPSMP SNAPTOOL TRAINER
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, wait_socket  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import Skips  # noqa: E402

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn |info |debug) snapsmp\[(\d+)\]: (.*)$")
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def lines(text, pid):
    """(level, message) of each line; every line must be well formed."""
    out = []
    for ln in text.splitlines():
        m = LINE.match(ln)
        check(m is not None and int(m.group(2)) == pid, f"malformed log line: {ln!r}")
        if m:
            out.append((m.group(1).strip(), m.group(3)))
    return out


def stop(smp, store):
    smp.send_signal(signal.SIGTERM)
    rc = smp.wait(timeout=120)
    check(rc == 0, f"snapsmp exited {rc} on SIGTERM")
    # The next daemon's socket is what the test waits for: none may be left.
    sock = os.path.join(store, "smp.sock")
    if os.path.exists(sock):
        os.unlink(sock)


def main():
    snapsmp, snaptool, trainer = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="snaplog.", dir="/dev/shm")
    store, flush, logf = os.path.join(tmp, "store"), os.path.join(tmp, "flush"), os.path.join(tmp, "smp.log")
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="lj", SNAP_WORLD_SIZE="1", SNAP_RANK="0",
               SNAP_TIMEOUT_MS="60000")
    for k in ("SNAP_LOG", "SNAP_LOG_LEVEL"):
        env.pop(k, None)

    # 1. info to a file: the state changes, one line each.
    smp = subprocess.Popen([snapsmp, "--store", store, "--flush-dir", flush, "--mem-limit", "64M", "--log", logf],
                           env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_socket([store], smp)
        r = subprocess.run([trainer, "--steps", "2", "--bytes", "16K", "--quiet"], env=env)
        check(r.returncode == 0, f"trainer exited {r.returncode}")
        r = subprocess.run([snaptool, "flush", "--store", store, "--job", "lj"], capture_output=True, text=True)
        check(r.returncode == 0, f"snaptool flush: {r.stderr}")
        w = Waiter()
        got = w.until(lambda: "persisted step 2 of job lj" in open(logf).read(), 120, dirs=lambda: [tmp], procs=[smp])
        w.close()
        check(got, "no 'persisted step 2' line in the log file")
    finally:
        stop(smp, store)
    err = smp.stderr.read()
    check(err == "", f"snapsmp --log FILE wrote to stderr: {err!r}")
    got = lines(open(logf).read(), smp.pid)
    msgs = [m for _, m in got]
    for want in (r"^serving store ", r"^job lj rank 0/1 connected", r"^flushing step 2 of job lj to ",
                 r"^persisted step 2 of job lj: ", r"^signal 15: shutting down", r"^step 2 of job lj restorable: "):
        n = sum(bool(re.search(want, m)) for m in msgs)
        check(n == 1, f"want one line matching {want!r} at info, found {n}: {msgs}")
    check(all(lv in ("info", "warn") for lv, _ in got), f"levels other than info/warn by default: {got}")
    check(not any(m.startswith("setting ") for m in msgs), "debug lines at the default level")

    # 2. SNAP_LOG_LEVEL=debug on stderr: the settings first.
    smp = subprocess.Popen([snapsmp, "--store", store, "--mem-limit", "64M"], env=dict(env, SNAP_LOG_LEVEL="debug"),
                           stderr=subprocess.PIPE, text=True)
    wait_socket([store], smp)
    stop(smp, store)
    got = lines(smp.stderr.read(), smp.pid)
    check(got and got[0][0] == "debug" and got[0][1].startswith("setting store=" + store), f"debug: {got[:2]}")
    check(("debug", "setting log_level=debug log=stderr") in got, f"debug: no log settings line: {got}")
    check(any(lv == "info" and m.startswith("serving store") for lv, m in got), "debug hides the info lines")

    # 3. warn (flag) and --quiet: not one info line.
    for flags in (["--log-level", "warn"], ["--quiet"], ["--log-level", "error"]):
        smp = subprocess.Popen([snapsmp, "--store", store, "--mem-limit", "64M", *flags], env=env,
                               stderr=subprocess.PIPE, text=True)
        wait_socket([store], smp)
        stop(smp, store)
        got = lines(smp.stderr.read(), smp.pid)
        check(all(lv in ("warn", "error") for lv, _ in got) and not (flags[-1] == "error" and got),
              f"{flags}: lines below the level: {got}")

    # 4. refused settings.
    for argv, extra, word in (([snapsmp, "--store", store, "--log-level", "loud"], {}, "--log-level loud"),
                              ([snapsmp, "--store", store], {"SNAP_LOG_LEVEL": "trace"}, "SNAP_LOG_LEVEL"),
                              ([snapsmp, "--store", store, "--log", os.path.join(tmp, "no", "dir", "x.log")], {},
                               "--log "),
                              # per-node flush directories name a mesh node: only with --ec
                              ([snapsmp, "--store", store, "--flush-dir", os.path.join(tmp, "node%n")], {},
                               "needs --ec"),
                              ([snapsmp, "--store", store, "--flush-direct", "2"], {}, "--flush-direct 2"),
                              ([snapsmp, "--store", store], {"SNAP_FLUSH_DIRECT": "yes"}, "SNAP_FLUSH_DIRECT")):
        r = subprocess.run(argv, env=dict(env, **extra), capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and word in r.stderr, f"{argv[3:]} {extra}: exit {r.returncode}: {r.stderr!r}")

    # 5. --flush-direct: the persisted line says how the rank files reached the disk. The flush
    # directory is on the working directory's file system (tmpfs refuses O_DIRECT).
    disk = tempfile.mkdtemp(prefix="snaplog-flush.", dir=os.getcwd())
    try:
        fd = os.open(os.path.join(disk, "probe"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        os.close(fd)
        can_direct = True
    except OSError:
        can_direct = False
    skips = Skips()
    skips.optional("the O_DIRECT expectation", f"a flush directory that takes O_DIRECT ({disk} refuses it)",
                   can_direct)
    cases = [(["--flush-direct", "0"], "through the page cache"), ([], "O_DIRECT" if can_direct else None)]
    for i, (flags, want) in enumerate(cases):
        job, logd = f"ld{i}", os.path.join(tmp, f"direct{i}.log")
        smp = subprocess.Popen([snapsmp, "--store", store, "--flush-dir", os.path.join(disk, str(i)), "--mem-limit",
                                "64M", "--log", logd, *flags], env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_socket([store], smp)
            r = subprocess.run([trainer, "--steps", "1", "--bytes", "64K", "--quiet"], env=dict(env, SNAP_JOB=job))
            check(r.returncode == 0, f"{flags}: trainer exited {r.returncode}")
            r = subprocess.run([snaptool, "flush", "--store", store, "--job", job], capture_output=True, text=True)
            check(r.returncode == 0, f"{flags}: snaptool flush: {r.stderr}")
            w = Waiter()
            w.until(lambda: f"persisted step 1 of job {job}" in open(logd).read(), 120, dirs=lambda: [tmp],
                    procs=[smp])
            w.close()
        finally:
            stop(smp, store)
        line = [m for _, m in lines(open(logd).read(), smp.pid) if m.startswith(f"persisted step 1 of job {job}: ")]
        check(len(line) == 1, f"{flags}: no persisted line: {open(logd).read()!r}")
        if line and want:
            check(line[0].endswith(", " + want), f"{flags}: expected '{want}': {line[0]!r}")
    shutil.rmtree(disk, ignore_errors=True)

    shutil.rmtree(tmp, ignore_errors=True)
    if fails:
        sys.exit(f"{len(fails)} failures")
    print(f"check_log: levels, timestamps and the file destination behave as documented; {skips.summary()}")


main()
