# SPDX-License-Identifier: BSD-3-Clause
"""snapsmp --metrics-file: the daemon's state in Prometheus' text format.

A real snapsmp (flush directory, --flush-every 2, --metrics-interval 1)
serves the example trainer, which commits 6 steps; snaptool flush asks for
the newest step and then a job the store does not hold (one request error). Then, waiting on the
metrics file's renames (inotify), never on a timer:
  - every line of the file is a HELP, a TYPE or a sample of a family that
    has both; counters end in _total; histogram buckets are cumulative and
    +Inf equals _count;
  - the values are snaptool status --json's for the same store: bytes the
    daemon counts and its budget, the newest restorable step ("latest"),
    the newest committed and persisted steps; 6 saves and commits observed,
    the flushes' durations, one request error;
  - the file is 0644, no temporary file is left, and a SIGTERM removes it;
  - a metrics file in a missing directory and --metrics-interval 0 are
    refused at start, naming what is wrong.
With --prometheus, the same numbers must come back through a real
Prometheus: node_exporter's textfile collector reads the directory and a
Prometheus (scrape interval 1 s, its own port and storage) scrapes it; the
HTTP API (/api/v1/query) must return the values snaptool reports. Exit 77
when prometheus or prometheus-node-exporter is not installed.
usage: check_metrics.py SNAPSMP SNAPTOOL TRAINER [--prometheus]
"""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import Waiter, wait_socket  # noqa: E402

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def parse(text):
    """{(name, frozenset(labels)): value}, checking the format as it goes."""
    helps, types, out = set(), {}, {}
    for ln in text.splitlines():
        if ln.startswith("# HELP "):
            helps.add(ln.split()[2])
            continue
        if ln.startswith("# TYPE "):
            p = ln.split()
            check(len(p) == 4 and p[3] in ("gauge", "counter", "histogram"), f"bad TYPE line {ln!r}")
            types[p[2]] = p[3]
            continue
        m = SAMPLE.match(ln)
        check(m is not None, f"malformed line {ln!r}")
        if not m:
            continue
        name, labels = m.group(1), dict(LABEL.findall(m.group(2)))
        fam = re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in types else name
        check(fam in helps and fam in types, f"{name}: no HELP or TYPE for {fam}")
        check(types.get(fam) != "counter" or fam.endswith("_total"), f"counter {fam} does not end in _total")
        check("node" in labels, f"{name}: no node label")
        out[(name, frozenset(labels.items()))] = float(m.group(3))
    # histograms: cumulative buckets, +Inf == _count
    for fam, t in types.items():
        if t != "histogram":
            continue
        series = {}
        for (name, labels), v in out.items():
            if name == fam + "_bucket":
                d = dict(labels)
                le = d.pop("le")
                series.setdefault(frozenset(d.items()), []).append((float(le), v))
        for labels, b in series.items():
            b.sort()
            check(all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)), f"{fam}: buckets not cumulative")
            check(b[-1][0] == float("inf") and b[-1][1] == out.get((fam + "_count", labels)),
                  f"{fam}: +Inf bucket differs from _count")
    return out


def value(samples, name, **labels):
    for (n, ls), v in samples.items():
        d = dict(ls)
        if n == name and all(d.get(k) == w for k, w in labels.items()):
            return v
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def prom_query(port, q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            d = json.load(r)
    except OSError:
        return None
    res = d.get("data", {}).get("result", []) if d.get("status") == "success" else []
    return float(res[0]["value"][1]) if len(res) == 1 else None


def through_prometheus(tmp, mdir, want):
    """node_exporter (textfile collector only) + Prometheus; every name in
    `want` must come back with its value. Everything started is killed by pid."""
    nx_port, pr_port = free_port(), free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"scrape_configs:\n  - job_name: snapsmp\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{nx_port}']\n")
    logs = [open(os.path.join(tmp, n), "w") for n in ("node_exporter.log", "prometheus.log")]
    procs = [
        subprocess.Popen(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{nx_port}",
                          "--collector.disable-defaults", "--collector.textfile",
                          f"--collector.textfile.directory={mdir}"], stdout=logs[0], stderr=subprocess.STDOUT),
        subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/tsdb",
                          f"--web.listen-address=127.0.0.1:{pr_port}"], stdout=logs[1], stderr=subprocess.STDOUT),
    ]
    try:
        # Prometheus' scrape is the event; the API is asked until it has it
        # (no other signal exists), under one generous deadline.
        deadline = time.monotonic() + 120
        got = {}
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            # The target's job label is Prometheus' (job="snapsmp"); ours becomes exported_job.
            got = {q: prom_query(pr_port, q) for q in want}
            if all(got[q] == v for q, v in want.items()):
                break
            time.sleep(0.5)
        for q, v in want.items():
            check(got.get(q) == v, f"Prometheus: {q} = {got.get(q)}, snaptool says {v}")
        print(f"Prometheus {pr_port} via node_exporter {nx_port}: " +
              ", ".join(f"{q} = {got.get(q)}" for q in want))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    if fails:
        for n in ("node_exporter.log", "prometheus.log"):
            with open(os.path.join(tmp, n)) as f:
                print(f"--- {n} (tail)\n" + "".join(f.readlines()[-15:]))


def main():
    args = [a for a in sys.argv[1:] if a != "--prometheus"]
    prom = "--prometheus" in sys.argv
    if len(args) != 3:
        print(__doc__)
        return 2
    snapsmp, snaptool, trainer = args
    if prom and not (shutil.which("prometheus") and shutil.which("prometheus-node-exporter")):
        print("SKIP: prometheus or prometheus-node-exporter not installed (scripts/install-deps.sh)")
        return 77
    tmp = tempfile.mkdtemp(prefix="snap-metrics-")
    store = tempfile.mkdtemp(prefix="snap-metrics-", dir="/dev/shm")
    mdir, flush = os.path.join(tmp, "textfile"), os.path.join(tmp, "flush")
    os.mkdir(mdir)
    mfile = os.path.join(mdir, "snapsmp.prom")
    env = dict(os.environ, SNAP_STORE=store, SNAP_JOB="metrics", SNAP_FLUSH_DIR=flush)
    for k in ("SNAP_SOCKET", "SNAP_METRICS_FILE", "SNAP_METRICS_INTERVAL"):
        env.pop(k, None)
    smp = None
    try:
        # refused at start
        r = subprocess.run([snapsmp, "--store", store, "--metrics-file", os.path.join(tmp, "no", "such.prom")],
                           env=env, capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and "no/such.prom" in r.stderr, f"missing directory: exit {r.returncode}, {r.stderr!r}")
        r = subprocess.run([snapsmp, "--store", store, "--metrics-file", mfile, "--metrics-interval", "0"],
                           env=env, capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "--metrics-interval" in r.stderr, f"interval 0: exit {r.returncode}, {r.stderr!r}")

        smp = subprocess.Popen([snapsmp, "--flush-every", "2", "--mem-limit", "256M", "--metrics-file", mfile,
                                "--metrics-interval", "1", "-q"], env=env)
        if not wait_socket(store, smp):
            check(False, "snapsmp did not start")
            return 1
        r = subprocess.run([trainer, "--steps", "6", "--bytes", "300000", "--quiet"], env=env, timeout=120)
        check(r.returncode == 0, f"trainer exited {r.returncode}")
        # The newest step persisted (this waits for the flush --flush-every started).
        r = subprocess.run([snaptool, "flush"], env=env, capture_output=True, timeout=120)
        check(r.returncode == 0, f"snaptool flush exited {r.returncode}: {r.stderr!r}")
        r = subprocess.run([snaptool, "flush", "--job", "no-such-job"], env=env, capture_output=True, timeout=60)
        check(r.returncode != 0, "snaptool flush of a missing job succeeded")
        st = json.loads(subprocess.run([snaptool, "status", "--json"], env=env, capture_output=True, text=True,
                                       timeout=60).stdout)
        job = next(j for j in st["jobs"] if j["job"] == "metrics")
        latest, committed = job["latest"], max(s["step"] for s in job["steps"])
        persisted = job["persisted"][0] if job["persisted"] else None
        check(latest == 6 and persisted == 6, f"snaptool: latest {latest}, persisted {job['persisted']}")

        def settled():
            try:
                with open(mfile) as f:
                    text = f.read()
            except FileNotFoundError:
                return None
            s = parse_quiet(text)
            ok = (value(s, "libsnap_restorable_step", job="metrics") == latest and
                  value(s, "libsnap_persisted_step", job="metrics") == persisted and
                  value(s, "libsnap_request_errors_total") == 1 and
                  value(s, "libsnap_store_used_bytes") == st["daemon_mem_used"])
            return text if ok else None

        w = Waiter()
        w.watch(mdir)
        text = w.until(settled, limit=120, procs=[smp])
        w.close()
        check(text is not None, "the metrics file never showed snaptool's values")
        if text is None:
            with open(mfile) as f:
                print(f.read())
            return 1
        s = parse(text)
        labels = dict(job="metrics", node=socket.gethostname() if not os.environ.get("SLURMD_NODENAME") else
                      os.environ["SLURMD_NODENAME"])
        expect = {
            "libsnap_store_used_bytes": st["daemon_mem_used"], "libsnap_store_budget_bytes": st["mem_limit"],
            "libsnap_committed_step": committed, "libsnap_restorable_step": latest,
            "libsnap_persisted_step": persisted, "libsnap_save_duration_seconds_count": 6,
            "libsnap_commit_duration_seconds_count": 6, "libsnap_flush_failures_total": 0,
            "libsnap_job_slot_bytes": st["mem_used"], "libsnap_job_pinned_bytes": st["pinned"],
        }
        for name, v in expect.items():
            per_job = not name.startswith("libsnap_store_")
            got = value(s, name, **(labels if per_job else {"node": labels["node"]}))
            check(got == v, f"{name} = {got}, expected {v}")
        fl = value(s, "libsnap_flush_duration_seconds_count", job="metrics")
        check(fl is not None and fl >= 1, f"libsnap_flush_duration_seconds_count = {fl}")
        age = value(s, "libsnap_persisted_step_age_seconds", job="metrics")
        check(age is not None and 0 <= age < 120, f"persisted step age {age}")
        check(value(s, "libsnap_protected_step") is None, "a protected step without a mesh")
        mode = stat.S_IMODE(os.stat(mfile).st_mode)
        check(mode == 0o644, f"metrics file mode {mode:o}")
        check(sorted(os.listdir(mdir)) == ["snapsmp.prom"], f"left in the directory: {os.listdir(mdir)}")
        print(f"metrics file: {len(s)} samples; restorable {latest}, persisted {persisted}, "
              f"bytes {st['daemon_mem_used']} as snaptool says")

        if prom:
            q = lambda n: f'{n}{{exported_job="metrics"}}'  # noqa: E731
            through_prometheus(tmp, mdir, {
                q("libsnap_restorable_step"): latest, q("libsnap_persisted_step"): persisted,
                q("libsnap_committed_step"): committed, q("libsnap_job_slot_bytes"): st["mem_used"],
                "libsnap_store_used_bytes": st["daemon_mem_used"], "libsnap_store_budget_bytes": st["mem_limit"],
            })

        smp.send_signal(signal.SIGTERM)
        rc = smp.wait(timeout=120)
        smp = None
        check(rc == 0, f"snapsmp exited {rc} on SIGTERM")
        check(not os.path.exists(mfile), "the metrics file outlived a clean shutdown")
    finally:
        if smp:
            smp.kill()
            smp.wait()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not fails else f"{len(fails)} failure(s)")
    return 1 if fails else 0


def parse_quiet(text):
    """parse() without recording failures: a file read while waiting."""
    saved = list(fails)
    try:
        return parse(text)
    finally:
        fails[:] = saved


if __name__ == "__main__":
    sys.exit(main())
