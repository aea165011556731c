#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""snapsmp says at start whether its store gets huge pages (hugepages.c),
checked against real tmpfs mounts, made for the test (exits 77, saying so,
without CAP_SYS_ADMIN or tmpfs huge pages; a failing mount fails):

  - a tmpfs mounted with huge=within_size: "gets huge pages (tmpfs,
    huge=within_size)"; the test also says whether the kernel backed a 4
    MiB file there with huge pages (/proc/meminfo ShmemHugePages), which
    depends on free 2 MiB pages and is not asserted;
  - a tmpfs with huge=never: "gets no huge pages (tmpfs, huge=never)" and
    the advice naming -o huge=within_size;
  - a tmpfs without a huge= option: the same (never is the default, which
    /proc/self/mountinfo does not show);
  - a store below the mount point, in a subdirectory: the mount's setting;
  - a store that is not on a tmpfs (the build tree, when it is not): no line.

Each daemon is started, the test waits for its "serving store" line
(inotify on the log's directory), then SIGTERMs it and requires exit 0.
usage: check_hugepages.py SNAPSMP TMPDIR_ON_DISK
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import can_mount, skip_test  # noqa: E402

snapsmp, disk = sys.argv[1], sys.argv[2]
top = tempfile.mkdtemp(prefix="hugepages.", dir="/tmp")
mounted = []


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def start_line(store):
    """The daemon's log from start to its serving line, then SIGTERM."""
    os.makedirs(store, exist_ok=True)
    log = os.path.join(top, "smp.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([snapsmp, "--store", store, "--mem-limit", "64M"], stdout=lf, stderr=subprocess.STDOUT)

    def serving():
        with open(log) as f:
            return "serving store" in f.read()

    w = Waiter()
    w.watch(top)
    up = w.until(serving, limit=120, procs=[p])
    w.close()
    if not up:
        with open(log) as f:
            text = f.read()
        p.kill()
        fail(f"snapsmp on {store} never served: {text}")
    p.terminate()
    if p.wait(timeout=120) != 0:
        fail(f"snapsmp on {store} exited {p.returncode} after SIGTERM")
    with open(log) as f:
        return f.read()


def mount(name, opts):
    d = os.path.join(top, name)
    os.mkdir(d)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(["size=64M"] + opts), "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode:
        return None, r.stderr.strip()
    mounted.append(d)
    return d, ""


try:
    # Decided before anything runs, from what the machine has: with it, a
    # failing mount is a failure.
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            forced = next((w.strip("[]") for w in f.read().split() if w.startswith("[")), "")
    except OSError:
        skip_test("check_hugepages", "this kernel has no transparent huge pages for tmpfs")
    if forced in ("force", "deny"):
        skip_test("check_hugepages", f"shmem_enabled={forced} overrides every tmpfs mount's huge= option")
    if not can_mount():
        skip_test("check_hugepages", "needs CAP_SYS_ADMIN to mount a tmpfs (root, as in CI)")
    huge, why = mount("huge", ["huge=within_size"])
    if not huge:
        fail(f"cannot mount a huge=within_size tmpfs as a process that may mount: {why}")
    never, _ = mount("never", ["huge=never"])
    plain, _ = mount("plain", [])

    # the premise: the kernel does back files there with huge pages
    before = meminfo("ShmemHugePages")
    with open(os.path.join(huge, "probe"), "wb") as f:
        f.write(b"\1" * (4 << 20))
    after = meminfo("ShmemHugePages")
    os.unlink(os.path.join(huge, "probe"))
    # Not asserted: the kernel falls back to 4 KiB pages when it finds no
    # free 2 MiB one (memory fragmented by the tests before this one), and
    # the counter is the whole machine's.
    if before is None or after - before < 2048:
        print(f"NOTE: a 4 MiB file on the huge=within_size tmpfs took {after - before} kB of ShmemHugePages: "
              "the kernel fell back to 4 KiB pages this time (no free 2 MiB page?)")
    else:
        print(f"huge=within_size: a 4 MiB file took {after - before} kB of huge pages")

    t = start_line(os.path.join(huge, "store"))
    if "gets huge pages (tmpfs, huge=within_size)" not in t:
        fail(f"huge=within_size: {t}")
    t = start_line(os.path.join(never, "deep", "store"))
    if "gets no huge pages (tmpfs, huge=never)" not in t or "-o huge=within_size" not in t:
        fail(f"huge=never (a store two levels below the mount): {t}")
    t = start_line(os.path.join(plain, "store"))
    if "gets no huge pages (tmpfs, huge=never)" not in t:
        fail(f"no huge= option: {t}")
    print("huge=within_size, huge=never (below the mount point), no option: each line says so")
    d = tempfile.mkdtemp(prefix="hp.", dir=disk)
    try:
        if subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip() != "tmpfs":
            t = start_line(os.path.join(d, "store"))
            if "huge pages" in t:
                fail(f"a store on {d}, not a tmpfs, got a huge pages line: {t}")
            print(f"{d}: not a tmpfs, no line")
        else:
            print(f"{d} is a tmpfs: the not-a-tmpfs case is not checked here")
    finally:
        shutil.rmtree(d, ignore_errors=True)
finally:
    for d in mounted:
        subprocess.run(["umount", d])
    shutil.rmtree(top, ignore_errors=True)
print("check_hugepages: OK")
