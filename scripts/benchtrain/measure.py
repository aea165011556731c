# SPDX-License-Identifier: BSD-3-Clause
"""Host and device measurements: peak RSS, pinned bytes, /dev/shm usage,
the device-to-host copy speed, percentiles."""
import os
import time

import torch



# ---- host and device measurements -------------------------------------------

def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssShmem", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_hwm():
    """VmHWM back to the current RSS (Linux: clear_refs 5), so each mode's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def du(path):
    n = 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    for root, _, files in os.walk(path):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return n


def host_pinned_peak():
    f = getattr(torch.cuda, "host_memory_stats", None)
    if f is None or not torch.cuda.is_available():
        return None
    try:
        st = f()
        return int(st.get("allocated_bytes.all.peak", st.get("reserved_bytes.all.peak", 0)))
    except Exception:
        return None


def reset_host_pinned_peak():
    f = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
    if f is not None and torch.cuda.is_available():
        try:
            f()
        except Exception:
            pass


def d2h_gbps(dev, nbytes=1 << 30):
    """Device-to-host copy speed into pinned memory (cudaMemcpyAsync), best of 3: what a state's copy can reach."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = None
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    del src, dst
    return round(nbytes / best / 1e9, 2)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def ms(x):
    return None if x is None else round(x * 1e3, 3)
