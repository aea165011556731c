# SPDX-License-Identifier: BSD-3-Clause
"""The bench's JSON and its text table."""
import json
import math
import os




def finish(out):
    """Overheads and the < 1% frequency, from the baseline's mean step."""
    modes = out["modes"]
    base = next((r for r in modes if r["mode"] == "base" and r["status"] != "skipped" and r.get("step_ms")), None)
    if base is None:
        return out
    b = base["step_ms"]["mean"]
    for r in modes:
        if not r.get("step_ms"):
            continue
        mean = r["step_ms"]["mean"]
        r["overhead_pct"] = round(100.0 * (mean - b) / b, 2)
        if r["kind"] not in (None, "none") and r.get("saves"):
            cost = max(0.0, (mean - b) * r["every"])     # ms per save, over the baseline
            r["save_cost_ms"] = round(cost, 3)
            r["every_k_for_1pct"] = max(1, math.ceil(cost / (0.01 * b) - 1e-9))
        if base.get("gpu_driver_used_bytes") is not None and r.get("gpu_driver_used_bytes") is not None:
            r["gpu_driver_added_bytes"] = r["gpu_driver_used_bytes"] - base["gpu_driver_used_bytes"]
        if r["mode"] == "base2":
            out["meta"]["noise_pct"] = r["overhead_pct"]
        if r is not base and "losses" in r and "losses" in base:
            n = min(len(r["losses"]), len(base["losses"]))
            r["losses_equal_base"] = r["losses"][:n] == base["losses"][:n]
    return out


def write_json(path, out):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def _g(x, k=None, scale=1.0, fmt="{:.2f}"):
    v = x if k is None else (x or {}).get(k)
    return "-" if v is None else fmt.format(v * scale if scale != 1.0 else v)


def fmt_row(r):
    if r["status"] in ("skipped", "failed"):
        return f"{r['mode']:<20} {r['status'].upper()}: {r.get('reason')}"
    return (f"{r['mode']:<20} {_g(r['step_ms'], 'median'):>9} {_g(r['step_ms'], 'p10'):>8}-{_g(r['step_ms'], 'p90'):<8} "
            f"{_g(r['step_ms'], 'mean'):>9} {_g(r.get('overhead_pct')):>7} {_g(r.get('stall_ms'), 'median'):>9} "
            f"{_g(r.get('stall_ms'), 'max'):>9} {_g(r.get('commit_ms'), 'median'):>9} "
            f"{_g(r.get('every_k_for_1pct'), fmt='{}'):>6} {_g(r.get('host_rss_added_bytes'), scale=2**-30):>7} "
            f"{_g(r.get('pinned_bytes') or r.get('host_pinned_torch_peak_bytes'), scale=2**-30):>7} "
            f"{_g(r.get('gpu_added_bytes'), scale=2**-30):>7}")


HEADER = (f"{'mode':<20} {'med ms':>9} {'p10-p90 ms':^17} {'mean ms':>9} {'ovh %':>7} {'stall ms':>9} "
          f"{'stall max':>9} {'commit ms':>9} {'1%@K':>6} {'RSS+GiB':>7} {'pin GiB':>7} {'GPU+GiB':>7}")


def table(out):
    m = out["meta"]
    lines = [f"{m['preset']} ({m['params'] / 1e6:.0f}M params, state {m['state_bytes'] / 2**30:.2f} GiB) on "
             f"{m['gpu'] or 'cpu'}, torch {m['torch']}, {m['steps']} steps/mode"
             + (f", noise (base2 vs base) {m['noise_pct']}%" if "noise_pct" in m else "")
             + (f", D2H pinned {m['d2h_pinned_gbps']} GB/s (state copy {m['state_copy_ms_at_d2h']} ms)"
                if m.get("d2h_pinned_gbps") else ""), HEADER]
    lines += [fmt_row(r) for r in out["modes"]]
    return "\n".join(lines)
