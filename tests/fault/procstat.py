# SPDX-License-Identifier: BSD-3-Clause
"""What a process holds, from /proc, and how two samples of it compare: the
memory checks' (smp.memory, fault.mesh_memory, preload.memory,
python.memory)."""
import os
from collections import Counter


def fd_names(pid):
    """What pid's open descriptors name, kernel object numbers dropped."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}").split(":[")[0])
        except OSError:
            pass   # closed meanwhile
    return out


def sanitized(path):
    """Whether the program at path is built with AddressSanitizer (its
    allocator settles a few hundred KiB higher over a long run)."""
    with open(path, "rb") as f:
        return b"__asan_init" in f.read()


def sample(pid):
    """RssAnon and VmData (what malloc holds, touched or not: a leaked block
    big enough to be mapped of its own is never resident) in bytes, open descriptors (what they name, kernel object
    numbers dropped) and threads (io_uring's kernel workers, which come and
    go with the ring's work, not counted) of a live process."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.split()
    # Descriptors: those in two listings taken back to back. A daemon's
    # threads open a slot file for a moment (to map it, to check it), which
    # one listing may catch; a leaked descriptor is in both.
    fds = sorted((Counter(fd_names(pid)) & Counter(fd_names(pid))).elements())
    threads = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if not name.startswith("iou-"):
            threads.append(name)
    return {"rss_anon": int(fields["RssAnon"][0]) * 1024, "vm_data": int(fields["VmData"][0]) * 1024,
            "fds": sorted(fds), "threads": sorted(threads)}


# VmData moves in steps of malloc's heap (its 128 KiB top pad, page
# rounded: 140 KiB seen once in fault.mesh_memory, the same over 100, 300 and
# 600 steps), touched or not: two such steps are allowed on top of `allow`.
HEAP_STEPS = 256 << 10


def compare(who, a, b, steps, allow, unit="steps", allow_data=None):
    """Two samples of one process `steps` apart: (the line to print, the
    problems: anonymous resident memory grown past `allow` bytes, VmData
    grown past `allow_data` (default `allow` + HEAP_STEPS: what malloc
    holds, touched or not, so a leaked block mapped on its own and never
    written, which RssAnon does not see, shows here), a descriptor or a
    thread more or less). A touched leak of more than allow / steps bytes
    per step fails; an untouched one of more than allow_data / steps."""
    if allow_data is None:
        allow_data = allow + HEAP_STEPS
    grew = b["rss_anon"] - a["rss_anon"]
    grew_data = b["vm_data"] - a["vm_data"]
    line = (f"{who}: RssAnon {a['rss_anon'] >> 10} -> {b['rss_anon'] >> 10} KiB over {steps} {unit} "
            f"({grew / steps:+.0f} bytes each; allowed {allow >> 10} KiB), VmData "
            f"{grew_data >> 10:+} KiB (allowed {allow_data >> 10} KiB), {len(a['fds'])} -> {len(b['fds'])} descriptors, "
            f"{len(a['threads'])} -> {len(b['threads'])} threads")
    problems = []
    if grew > allow:
        problems.append(f"{who}'s anonymous memory grew {grew >> 10} KiB over {steps} {unit}")
    if grew_data > allow_data:
        problems.append(f"{who}'s VmData grew {grew_data >> 10} KiB over {steps} {unit}")
    if b["fds"] != a["fds"]:
        problems.append(f"{who} holds {b['fds']}, before {a['fds']}")
    if b["threads"] != a["threads"]:
        problems.append(f"{who} runs {b['threads']}, before {a['threads']}")
    return line, problems
