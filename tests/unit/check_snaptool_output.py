# SPDX-License-Identifier: BSD-3-Clause
"""snaptool's output for scripts and for people:
  - --json validates against the schemas in docs/snaptool-json.md
    (extracted from that file, so the document is the contract) and says
    what the store holds;
  - `verify` draws a progress bar (bytes, rate) on a terminal (run under
    script(1), a pseudo-terminal) and nothing of it when stderr is a pipe.

A real snapsmp (with a flush directory) and two example trainers fill a
store whose path holds a double quote and a backslash: rank 0 commits steps
1-3, rank 1 steps 1-2 (the daemon runs with two slots, so rank 0 waits for
rank 1 before step 3), so step 2 is restorable and step 3 partial; step 2
is flushed. Then `status`, `ls` and `recover` (with and without a daemon, and
for a job that does not exist) must print documents that parse and
validate, with the expected values.
usage: check_snaptool_output.py DOC SNAPTOOL SNAPSMP TRAINER
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter  # noqa: E402

fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def schemas(doc):
    text = open(doc).read()
    out = {name: json.loads(body) for name, body in re.findall(r"```json (\w+)\n(.*?)```", text, re.S)}
    if set(out) != {"status", "ls", "recover"}:
        sys.exit(f"{doc}: expected schemas status, ls, recover; found {sorted(out)}")
    return out


TYPES = {"object": dict, "array": list, "string": str, "null": type(None)}


def validate(v, s, path="$"):
    """The subset of JSON Schema the document uses."""
    errs = []
    if "enum" in s and v not in s["enum"]:
        errs.append(f"{path}: {v!r} not in {s['enum']}")
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        ok = any((t == "integer" and isinstance(v, int) and not isinstance(v, bool)) or
                 (t in TYPES and isinstance(v, TYPES[t])) for t in types)
        if not ok:
            return errs + [f"{path}: {v!r} is not {s['type']}"]
    if isinstance(v, int) and not isinstance(v, bool) and "minimum" in s and v < s["minimum"]:
        errs.append(f"{path}: {v} < {s['minimum']}")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                errs.append(f"{path}: missing {k}")
        props = s.get("properties", {})
        for k, x in v.items():
            if k in props:
                errs += validate(x, props[k], f"{path}.{k}")
            elif s.get("additionalProperties") is False:
                errs.append(f"{path}: unexpected property {k}")
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            errs += validate(x, s["items"], f"{path}[{i}]")
    return errs


def run_json(schema, name, argv, want_rc=0):
    r = subprocess.run(argv, capture_output=True, text=True)
    check(r.returncode == want_rc, f"{' '.join(argv[1:])}: exit {r.returncode}, want {want_rc}: {r.stderr.strip()}")
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        check(False, f"{' '.join(argv[1:])}: not JSON ({e}): {r.stdout!r}")
        return None
    errs = validate(doc, schema[name])
    check(not errs, f"{' '.join(argv[1:])}: does not match the {name} schema: {errs}")
    return doc


def check_progress(snaptool, store):
    argv = [snaptool, "verify", "2", "--store", store, "--job", "js"]
    r = subprocess.run(argv, capture_output=True, text=True)
    check(r.returncode == 0 and "rank 1: ok" in r.stdout, f"verify (piped): exit {r.returncode}: {r.stdout}{r.stderr}")
    check("verify [" not in r.stderr and "\r" not in r.stderr and "\033" not in r.stderr,
          f"verify draws a progress bar into a pipe: {r.stderr!r}")
    # script(1) runs it on a pseudo-terminal: stdout and stderr are a tty.
    cmd = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    t = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True)
    check(t.returncode == 0, f"verify under script: exit {t.returncode}: {t.stdout}")
    check(re.search(r"verify \[#{30}\] 100%  [0-9.]+ / [0-9.]+ MiB  [0-9]+ MB/s", t.stdout) is not None,
          f"verify on a terminal shows no complete progress bar: {t.stdout!r}")
    check("rank 1: ok" in t.stdout, f"verify on a terminal lost its report: {t.stdout!r}")


def main():
    doc, snaptool, snapsmp, trainer = sys.argv[1:5]
    schema = schemas(doc)
    # Self-check of the validator: a document it must refuse.
    check(validate({"job": "j", "store_step": "2", "persisted_step": None, "restore_from": "x", "extra": 1},
                   schema["recover"]) != [], "the validator accepts a wrong document")
    tmp = tempfile.mkdtemp(prefix="snapjson.", dir="/dev/shm")
    store, flush = os.path.join(tmp, 'st"o\\re'), os.path.join(tmp, "flush")
    smp = subprocess.Popen([snapsmp, "--store", store, "--flush-dir", flush, "--mem-limit", "64M", "--slots", "2",
                            "--quiet"])
    try:
        env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="js", SNAP_WORLD_SIZE="2", SNAP_TIMEOUT_MS="60000")
        # Rank 0 first: with two slots it commits steps 1-2 and then waits,
        # connected, for rank 1 to commit step 2; rank 1 starts only then, so
        # both ranks belong to one generation of the job.
        log0 = os.path.join(tmp, "r0.log")
        r0 = subprocess.Popen([trainer, "--steps", "3", "--bytes", "16K", "--quiet", "--log", log0],
                              env=dict(env, SNAP_RANK="0"))
        w = Waiter()
        got2 = w.until(lambda: os.path.exists(log0) and "committed 2\n" in open(log0).read(), 120,
                       dirs=lambda: [tmp], procs=[r0])
        w.close()
        check(got2, "rank 0 did not commit step 2")
        r1 = subprocess.Popen([trainer, "--steps", "2", "--bytes", "16K", "--quiet"], env=dict(env, SNAP_RANK="1"))
        for p in (r1, r0):
            check(p.wait(timeout=120) == 0, "a trainer failed")
        r = subprocess.run([snaptool, "flush", "--store", store, "--job", "js"], capture_output=True, text=True)
        check(r.returncode == 0, f"snaptool flush: {r.stderr}")
        base = ["--store", store, "--flush-dir", flush]
        st = run_json(schema, "status", [snaptool, "status", *base, "--json"])
        if st:
            check(st["store"] == store, f"status: store {st['store']!r}, want {store!r}")
            check(st["daemon_pid"] == smp.pid and st["mem_limit"] == 64 << 20, f"status: daemon {st}")
            j = {x["job"]: x for x in st["jobs"]}.get("js")
            check(j is not None, "status: no job js")
            if j:
                states = {s["step"]: (s["state"], s["ranks"], s["world"]) for s in j["steps"]}
                check(j["latest"] == 2 and states.get(2) == ("restorable", 2, 2) and states.get(3) == ("partial", 1, 2),
                      f"status: job js {j}")
                check(j["persisted"] == [2], f"status: persisted {j['persisted']}, want [2]")
        ls = run_json(schema, "ls", [snaptool, "ls", "--store", store, "--json"])
        if ls is not None:
            got = sorted((x["step"], x["rank"]) for x in ls if x["job"] == "js")
            check((3, 0) in got and (2, 1) in got and (3, 1) not in got, f"ls: (step, rank) {got}")
        rc = run_json(schema, "recover", [snaptool, "recover", *base, "--job", "js", "--json"])
        if rc:
            check(rc == {"job": "js", "store_step": 2, "persisted_step": 2, "restore_from": "node store"},
                  f"recover: {rc}")
        check_progress(snaptool, store)
    finally:
        smp.send_signal(signal.SIGTERM)
        check(smp.wait(timeout=60) == 0, "snapsmp did not exit 0 on SIGTERM")
    st = run_json(schema, "status", [snaptool, "status", "--store", store, "--json"])
    if st:
        check(st["mem_limit"] is None and st["daemon_pid"] is None, f"status without a daemon: {st}")
    rc = run_json(schema, "recover", [snaptool, "recover", "--store", store, "--job", "none", "--json"], want_rc=3)
    if rc:
        check(rc["restore_from"] == "nothing" and rc["store_step"] is None, f"recover of a missing job: {rc}")
    shutil.rmtree(tmp, ignore_errors=True)
    if fails:
        sys.exit(f"{len(fails)} failures")
    print("check_snaptool_output: status, ls and recover --json validate against docs/snaptool-json.md; "
          "verify shows a progress bar on a terminal only")


main()
