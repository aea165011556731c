#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""CI's smoke test of scripts/bench_train.py: a tiny GPT on the CPU, a few
steps in every mode, against a real snapsmp the script starts. Fails if any
mode breaks or reports numbers that cannot be: every mode of the script must
be in the JSON, run (DCP may be skipped only where this torch has no
async_save, and must say so), save as often as its interval says, report a
positive step time, stall and commit, and leave the losses of the CPU run
bit-identical to the baseline's (checkpointing must not change training).
The recovery trials must resume bit-identically from each kind of file.

usage: bench_train_smoke.py BUILD SRC
"""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

build, src = sys.argv[1], sys.argv[2]
script = os.path.join(src, "scripts", "bench_train.py")
spec = importlib.util.spec_from_file_location("bench_train", script)
bt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bt)
failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def has_dcp():
    try:
        bt.dcp_api()
        return True
    except bt.Skip:
        return False


tag = f"snaptest-bench-{os.getpid()}"
store, shm = f"/dev/shm/{tag}", f"/dev/shm/{tag}-files"
out = os.path.join(build, "tests", "python", tag)
os.makedirs(out, exist_ok=True)
common = ["--preset", "tiny", "--device", "cpu", "--store", store, "--shm", shm,
          "--snapsmp", os.path.join(build, "smp", "snapsmp"), "--mem-limit", "1G"]
STEPS = 10
try:
    bench_json, rec_json = os.path.join(out, "bench.json"), os.path.join(out, "recover.json")
    rc = subprocess.run([sys.executable, script, "bench", "--steps", str(STEPS), "--warmup", "3", "--probes", "2",
                         "--json", bench_json] + common, timeout=600).returncode
    if rc != 0:
        fail(f"bench exited {rc}")
    if not os.path.exists(bench_json):
        fail("bench wrote no JSON")
        raise SystemExit(1)
    res = json.load(open(bench_json))
    state = res["meta"]["state_bytes"]
    if not state > 0:
        fail(f"state_bytes {state}")
    modes = {r["mode"]: r for r in res["modes"]}
    for m in bt.ALL_MODES:
        r = modes.get(m)
        if r is None:
            fail(f"mode {m} is missing from the JSON")
            continue
        if r["status"] == "skipped":
            if not m.startswith("dcp") or has_dcp() or not r.get("reason"):
                fail(f"mode {m} skipped: {r.get('reason')}")
            else:
                print(f"mode {m} skipped, as it must be here: {r['reason']}")
            continue
        if r["status"] != "ok":
            fail(f"mode {m}: {r['status']}: {r.get('reason')}")
            continue
        sm = r["step_ms"]
        if r["steps"] != STEPS or not 0 < sm["p10"] <= sm["median"] <= sm["p90"] <= sm["max"] < 60000:
            fail(f"mode {m}: {r['steps']} steps, step_ms {sm}")
        if not math.isfinite(r.get("overhead_pct", float("nan"))):
            fail(f"mode {m}: overhead_pct {r.get('overhead_pct')}")
        if not r.get("host_rss_peak_bytes", 0) > 0:
            fail(f"mode {m}: host_rss_peak_bytes {r.get('host_rss_peak_bytes')}")
        if r.get("losses_equal_base") is False:
            fail(f"mode {m}: its losses differ from the baseline's (checkpointing changed training)")
        if r["kind"] == "none":
            continue
        want = STEPS // r["every"]
        if r["saves"] != want:
            fail(f"mode {m}: {r['saves']} saves in {STEPS} steps, expected {want}")
        if not (r["stall_ms"] and r["stall_ms"]["median"] > 0):
            fail(f"mode {m}: stall_ms {r['stall_ms']}")
        if not (r["commit_ms"] and r["commit_ms"]["median"] > 0 and r["commit_ms"]["n"] == 2):
            fail(f"mode {m}: commit_ms {r['commit_ms']}")
        if not (isinstance(r.get("every_k_for_1pct"), int) and r["every_k_for_1pct"] >= 1):
            fail(f"mode {m}: every_k_for_1pct {r.get('every_k_for_1pct')}")
        if r["shm_bytes"] < 0.9 * state:
            fail(f"mode {m}: {r['shm_bytes']} bytes on /dev/shm for a state of {state}")
        if r["kind"] == "libsnap" and r["pinned_bytes"] != 0:
            fail(f"mode {m}: {r['pinned_bytes']} pinned bytes on the CPU (expected 0)")

    rc = subprocess.run([sys.executable, script, "recover", "--steps", "10", "--every-other", "3",
                         "--json", rec_json] + common, timeout=600).returncode
    if rc != 0:
        fail(f"recover exited {rc}")
    if not os.path.exists(rec_json):
        fail("recover wrote no JSON")
        raise SystemExit(1)
    rec = json.load(open(rec_json))
    runs = {r["ckpt"]: r for r in rec["runs"]}
    for k in ("snap", "dcp", "torch"):
        r = runs.get(k)
        if r is None:
            fail(f"recovery from {k} is missing")
        elif r["status"] == "skipped" and k == "dcp" and not has_dcp():
            print(f"recovery from dcp skipped, as it must be here: {r['reason']}")
        elif r["status"] != "ok":
            fail(f"recovery from {k}: {r['status']}: {r.get('reason')}")
        elif not (r["losses_equal"] and r["restored_step"] >= r["killed_after"] >= 1 and
                  0 < r["launch_to_restored_s"] <= r["launch_to_first_step_s"]):
            fail(f"recovery from {k}: {r}")
finally:
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
print("FAILED: " + "; ".join(failures) if failures else "bench_train: every mode ran and resumed bit-identically")
sys.exit(1 if failures else 0)
