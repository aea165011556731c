# SPDX-License-Identifier: BSD-3-Clause
"""snaptool's output for scripts and for people:
  - --json of every command (status, ls, inspect, verify, flush, export,
    gc, recover, and the error document of failures) validates against the
    schemas in docs/snaptool-json.md (extracted from that file, so the
    document is the contract) and says what the store holds;
  - --quiet prints nothing on stdout (the --json document excepted) and
    keeps errors on stderr; --verbose adds detail on stderr only;
  - flush, verify (node store and disk), recover and export --copy draw a
    progress bar (bytes, rate) on a terminal (run under script(1), a
    pseudo-terminal) and nothing of it when stderr is a pipe.

A real snapsmp (with a flush directory) and two example trainers fill a
store whose path holds a double quote and a backslash: rank 0 commits steps
1-3, rank 1 steps 1-2 (the daemon runs with two slots, so rank 0 waits for
rank 1 before step 3), so step 2 is restorable and step 3 partial; step 2
is flushed. Then `status`, `ls` and `recover` (with and without a daemon, and
for a job that does not exist) must print documents that parse and
validate, with the expected values; so must inspect (node store and flush
directory), verify (ok, incomplete, a corrupted chunk), flush, export
(virtual and --copy), gc and every failure's error document.
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
    want = {"status", "ls", "inspect", "verify", "flush", "export", "gc", "recover", "mesh", "error"}
    if set(out) != want:
        sys.exit(f"{doc}: expected schemas {sorted(want)}; found {sorted(out)}")
    return out


TYPES = {"object": dict, "array": list, "string": str, "null": type(None), "boolean": bool}


def validate(v, s, path="$"):
    """The subset of JSON Schema the document uses."""
    errs = []
    if "enum" in s and v not in s["enum"]:
        errs.append(f"{path}: {v!r} not in {s['enum']}")
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        ok = any((t == "integer" and isinstance(v, int) and not isinstance(v, bool)) or
                 (t == "number" and isinstance(v, (int, float)) and not isinstance(v, bool)) or
                 (t in TYPES and isinstance(v, TYPES[t])) for t in types)
        if not ok:
            return errs + [f"{path}: {v!r} is not {s['type']}"]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and "minimum" in s and v < s["minimum"]:
        errs.append(f"{path}: {v} < {s['minimum']}")
    if isinstance(v, str) and "pattern" in s and not re.search(s["pattern"], v):
        errs.append(f"{path}: {v!r} does not match {s['pattern']}")
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
    """argv's stdout is one document of schema `name` and it exits want_rc."""
    r = subprocess.run(argv, capture_output=True, text=True)
    check(r.returncode == want_rc, f"{' '.join(argv[1:])}: exit {r.returncode}, want {want_rc}: {r.stderr.strip()}")
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        check(False, f"{' '.join(argv[1:])}: not JSON ({e}): {r.stdout!r}")
        return None
    errs = validate(doc, schema[name])
    check(not errs, f"{' '.join(argv[1:])}: does not match the {name} schema: {errs}")
    if name == "error" and not errs:
        check(doc["exit"] == want_rc and doc["error"] in r.stderr,
              f"{' '.join(argv[1:])}: error document {doc} vs exit {r.returncode}, stderr {r.stderr!r}")
    return doc


def quoted(argv):
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


def on_tty(argv):
    """argv run by script(1) on a pseudo-terminal: (exit code, what the terminal got)."""
    t = subprocess.run(["script", "-qec", quoted(argv), "/dev/null"], capture_output=True, text=True)
    return t.returncode, t.stdout


BAR = r" \[#{30}\] 100%  [0-9.]+ / [0-9.]+ MiB  [0-9]+ MB/s"


def check_bar(argv, what, want_rc=0):
    """A complete bar named `what` on a terminal, none into a pipe; the same exit both ways."""
    r = subprocess.run(argv, capture_output=True, text=True)
    check(r.returncode == want_rc, f"{' '.join(argv[1:])} (piped): exit {r.returncode}: {r.stdout}{r.stderr}")
    check("[#" not in r.stderr and "\r" not in r.stderr and "\033" not in r.stderr,
          f"{' '.join(argv[1:])} draws a progress bar into a pipe: {r.stderr!r}")
    rc, out = on_tty(argv)
    check(rc == want_rc, f"{' '.join(argv[1:])} under script: exit {rc}: {out}")
    check(re.search(re.escape(what) + BAR, out) is not None,
          f"{' '.join(argv[1:])} on a terminal shows no complete \"{what}\" bar: {out!r}")
    return r, out


def check_progress(snaptool, store):
    argv = [snaptool, "verify", "2", "--store", store, "--job", "js"]
    r = subprocess.run(argv, capture_output=True, text=True)
    check(r.returncode == 0 and "rank 1: ok" in r.stdout, f"verify (piped): exit {r.returncode}: {r.stdout}{r.stderr}")
    check("verify [" not in r.stderr and "\r" not in r.stderr and "\033" not in r.stderr,
          f"verify draws a progress bar into a pipe: {r.stderr!r}")
    # script(1) runs it on a pseudo-terminal: stdout and stderr are a tty.
    t = subprocess.run(["script", "-qec", quoted(argv), "/dev/null"], capture_output=True, text=True)
    check(t.returncode == 0, f"verify under script: exit {t.returncode}: {t.stdout}")
    check(re.search(r"verify \[#{30}\] 100%  [0-9.]+ / [0-9.]+ MiB  [0-9]+ MB/s", t.stdout) is not None,
          f"verify on a terminal shows no complete progress bar: {t.stdout!r}")
    check("rank 1: ok" in t.stdout, f"verify on a terminal lost its report: {t.stdout!r}")


def check_commands(schema, snaptool, tmp, store, flush):
    """inspect, verify, export, gc, the error documents, --quiet and --verbose."""
    st = ["--store", store, "--job", "js"]
    ins = run_json(schema, "inspect", [snaptool, "inspect", "2", *st, "--json"])
    if ins:
        check(ins["job"] == "js" and ins["step"] == 2 and [x["rank"] for x in ins["ranks"]] == [0, 1] and
              all(x["source"] == "node store" and x["regions"] and x["world"] == 2 for x in ins["ranks"]),
              f"inspect 2: {ins}")
        g = ins["ranks"][0]["regions"][0] if ins["ranks"] and ins["ranks"][0]["regions"] else None
        # The text view names the same region with the same first CRC.
        txt = subprocess.run([snaptool, "inspect", "2", *st], capture_output=True, text=True).stdout
        check(g is not None and g["name"] in txt and g["crc32c"] and g["crc32c"][0] in txt,
              f"inspect --json and the text disagree: {g} vs {txt}")
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty, exist_ok=True)
    ins = run_json(schema, "inspect", [snaptool, "inspect", "2", "--store", empty, "--flush-dir", flush,
                                       "--job", "js", "--json"])
    if ins:
        check([x["source"] for x in ins["ranks"]] == ["flush directory"] * 2 and
              all(x["regions"] and x["error"] is None and x["regions"][0]["dataset"] for x in ins["ranks"]),
              f"inspect 2 from the flush directory: {ins}")
    run_json(schema, "error", [snaptool, "inspect", "9", *st, "--json"], want_rc=1)

    v = run_json(schema, "verify", [snaptool, "verify", "2", *st, "--flush-dir", flush, "--json"])
    if v:
        check(v["result"] == "ok" and v["ranks_present"] == 2 and v["world"] == 2 and
              v["persisted"] and v["persisted"]["state"] == "ok" and
              all(x["state"] == "ok" and not x["bad_chunks"] for x in v["ranks"]), f"verify 2: {v}")
    v = run_json(schema, "verify", [snaptool, "verify", "3", *st, "--json"], want_rc=3)
    if v:
        check(v["result"] == "incomplete" and v["ranks_present"] == 1 and v["persisted"] is None, f"verify 3: {v}")
    run_json(schema, "error", [snaptool, "verify", "9", *st, "--json"], want_rc=1)
    run_json(schema, "error", [snaptool, "verify", "x", *st, "--json"], want_rc=2)

    out = os.path.join(tmp, "export.h5")
    for mode in ("virtual", "copy"):
        ex = run_json(schema, "export", [snaptool, "export", "2", "-o", out, "--flush-dir", flush, "--job", "js",
                                         "--json"] + (["--copy"] if mode == "copy" else []))
        if ex:
            check(ex["mode"] == mode and ex["output"] == out and ex["bytes"] == os.path.getsize(out) > 0,
                  f"export {mode}: {ex}")
    run_json(schema, "error", [snaptool, "export", "7", "-o", out, "--flush-dir", flush, "--job", "js", "--json"],
             want_rc=1)
    run_json(schema, "error", [snaptool, "export", "2", "--flush-dir", flush, "--json"], want_rc=2)
    g = run_json(schema, "gc", [snaptool, "gc", "--keep", "1", "--flush-dir", flush, "--job", "js", "--json"])
    if g:
        check(g == {"job": "js", "keep": 1, "removed": 0}, f"gc: {g}")
    run_json(schema, "error", [snaptool, "gc", "--job", "js", "--json"], want_rc=2)
    run_json(schema, "error", [snaptool, "ls", "--bogus", "--json"], want_rc=2)
    # A malformed number is named as such, not taken for another mistake.
    for argv, says in (([snaptool, "gc", "--keep", "x", "--flush-dir", flush, "--json"], '--keep "x"'),
                       ([snaptool, "status", "--nodes", "x", "--store", "/nonexistent/node%n", "--json"],
                        '--nodes "x"'),
                       ([snaptool, "recover", "--nodes", "0", "--store", "/nonexistent/node%n", "--json"],
                        '--nodes "0"')):
        e = run_json(schema, "error", argv, want_rc=2)
        check(e is not None and says in e.get("error", ""), f"{' '.join(argv[1:])}: error does not say {says}: {e}")
    # The mesh view over 2 "nodes": node0 is this store (a link), node1 is lost.
    mesh = os.path.join(tmp, "mesh")
    os.makedirs(mesh, exist_ok=True)
    if not os.path.lexists(os.path.join(mesh, "node0")):
        os.symlink(store, os.path.join(mesh, "node0"))
    for cmd in ("status", "recover"):
        mv = run_json(schema, "mesh", [snaptool, cmd, "--nodes", "2", "--store", os.path.join(mesh, "node%n"),
                                       "--flush-dir", flush, "--json"], want_rc=0)
        if mv:
            jobs = {j["job"]: j for j in mv["jobs"]}
            check(mv["missing_nodes"] == [1] and "js" in jobs, f"{cmd} --nodes: {mv}")
            js = jobs.get("js", {})
            check(js.get("levels", {}).get("disk") == 2 and js.get("restore_level") in (1, 3) and
                  any(s["step"] == 2 and s["data_nodes"] == [0] and s["parity_nodes"] == [] for s in js.get("steps", [])),
                  f"{cmd} --nodes: job js: {js}")
    run_json(schema, "error", [snaptool, "status", "--nodes", "2", "--store", store, "--json"], want_rc=2)
    v = run_json(schema, "verify", [snaptool, "verify", "2", "--nodes", "2", "--store", os.path.join(mesh, "node%n"),
                                    "--job", "js", "--flush-dir", flush, "--json"])
    if v:
        check(v["result"] == "ok" and v["missing_nodes"] == [1] and v["missing_ranks"] == [] and
              all(x["node"] == 0 for x in v["ranks"]) and v["persisted"]["state"] == "ok", f"verify --nodes: {v}")
    run_json(schema, "error", [snaptool, "verify", "2", "--nodes", "2", "--store", store, "--json"], want_rc=2)

    # Progress: every command that reads the persisted step, on a terminal only.
    check_bar([snaptool, "verify", "2", *st, "--flush-dir", flush], "verify disk")
    check_bar([snaptool, "recover", *st, "--flush-dir", flush], "verify step 2")
    check_bar([snaptool, "export", "2", "-o", out, "--copy", "--flush-dir", flush, "--job", "js"], "export")
    # --quiet: no bar, nothing on stdout, the exit code and errors stay.
    rc, tout = on_tty([snaptool, "verify", "2", *st, "--flush-dir", flush, "--quiet"])
    check(rc == 0 and tout.strip() == "", f"verify --quiet on a terminal: exit {rc}: {tout!r}")
    for argv, want in (([snaptool, "ls", "--store", store, "-q"], 0), ([snaptool, "verify", "3", *st, "-q"], 3),
                       ([snaptool, "verify", "9", *st, "--quiet"], 1)):
        r = subprocess.run(argv, capture_output=True, text=True)
        check(r.returncode == want and r.stdout == "" and (want != 1 or "no step 9" in r.stderr),
              f"{' '.join(argv[1:])}: exit {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}")
    run_json(schema, "ls", [snaptool, "ls", "--store", store, "--json", "--quiet"])
    run_json(schema, "error", [snaptool, "ls", "--store", store, "-q", "-v", "--json"], want_rc=2)
    # --verbose: the same stdout, detail on stderr.
    for argv, detail in (([snaptool, "status", *st, "--flush-dir", flush], "snaptool status: store "),
                         ([snaptool, "verify", "2", *st], "snaptool verify: rank 1: slot "),
                         ([snaptool, "recover", *st, "--flush-dir", flush], "snaptool recover: persisted step 2: verifies"),
                         ([snaptool, "ls", "--store", store, "--json"], "snaptool ls: store ")):
        plain = subprocess.run(argv, capture_output=True, text=True)
        verb = subprocess.run(argv + ["--verbose"], capture_output=True, text=True)
        check(verb.returncode == plain.returncode and verb.stdout == plain.stdout and detail in verb.stderr and
              detail not in plain.stderr, f"{' '.join(argv[1:])} --verbose: stdout changed or no {detail!r} on "
              f"stderr: {verb.stderr!r}")


def check_corrupt(schema, snaptool, store):
    """A flipped byte in rank 1's slot of step 2: verify --json names the chunk, exit 3."""
    ins = run_json(schema, "inspect", [snaptool, "inspect", "2", "--store", store, "--job", "js", "--json"])
    if not ins or len(ins["ranks"]) < 2:
        return
    slot = os.path.join(store, "js", "rank-00001", f"slot-{ins['ranks'][1]['slot']}")
    with open(slot, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    v = run_json(schema, "verify", [snaptool, "verify", "2", "--store", store, "--job", "js", "--json"], want_rc=3)
    if v:
        r1 = [x for x in v["ranks"] if x["rank"] == 1]
        check(v["result"] == "corrupt" and r1 and r1[0]["state"] == "corrupt" and
              r1[0]["bad_chunks"] and r1[0]["bad_chunks"][0]["chunk"] == 0, f"verify of a corrupted chunk: {v}")


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
        # The flush of step 2 on a terminal: a bar of the bytes written
        # under the flush directory against the step's bytes.
        rc, out = on_tty([snaptool, "flush", "--store", store, "--job", "js", "--flush-dir", flush])
        check(rc == 0 and "step 2 persisted" in out, f"snaptool flush: exit {rc}: {out}")
        check(re.search("flush" + BAR, out) is not None, f"flush on a terminal shows no complete bar: {out!r}")
        fl = run_json(schema, "flush", [snaptool, "flush", "--store", store, "--job", "js", "--json"])
        if fl:
            check(fl["already_persisted"] and fl["step"] is None, f"flush of a persisted step: {fl}")
        r = subprocess.run([snaptool, "flush", "--store", store, "--job", "js", "--flush-dir", flush],
                           capture_output=True, text=True)
        check(r.returncode == 0 and "\r" not in r.stderr and "\033" not in r.stderr,
              f"flush (piped): exit {r.returncode}, stderr {r.stderr!r}")
        base = ["--store", store, "--flush-dir", flush]
        st = run_json(schema, "status", [snaptool, "status", *base, "--json"])
        if st:
            check(st["store"] == store, f"status: store {st['store']!r}, want {store!r}")
            check(st["daemon_pid"] == smp.pid and st["mem_limit"] == 64 << 20 and st["daemon_mem_used"] >= st["mem_used"],
                  f"status: daemon {st}")
            check(st["pinned"] == 0 and st["pinned_by"] == 0, f"status: host-only trainers pinned {st}")
            check(isinstance(st["daemon_reserving"], int), f"status: daemon_reserving {st}")
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
        check_commands(schema, snaptool, tmp, store, flush)
    finally:
        smp.send_signal(signal.SIGTERM)
        check(smp.wait(timeout=60) == 0, "snapsmp did not exit 0 on SIGTERM")
    st = run_json(schema, "status", [snaptool, "status", "--store", store, "--json"])
    if st:
        check(st["mem_limit"] is None and st["daemon_pid"] is None and st["daemon_mem_used"] is None
              and st["pinned"] is None and st["pinned_by"] is None and st["daemon_reserving"] is None,
              f"status without a daemon: {st}")
    rc = run_json(schema, "recover", [snaptool, "recover", "--store", store, "--job", "none", "--json"], want_rc=3)
    if rc:
        check(rc["restore_from"] == "nothing" and rc["store_step"] is None, f"recover of a missing job: {rc}")
    check_corrupt(schema, snaptool, store)
    shutil.rmtree(tmp, ignore_errors=True)
    if fails:
        sys.exit(f"{len(fails)} failures")
    print("check_snaptool_output: every command's --json validates against docs/snaptool-json.md; "
          "--quiet/--verbose keep to their streams; progress bars on a terminal only")


main()
