# SPDX-License-Identifier: BSD-3-Clause
"""What a process holds, from /proc: the memory checks' sample (smp.memory,
fault.mesh_memory)."""
import os


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
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds.append(os.readlink(f"/proc/{pid}/fd/{fd}").split(":[")[0])
        except OSError:
            pass   # closed meanwhile
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
