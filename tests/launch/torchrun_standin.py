#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A stand-in for torchrun (a test double, named as such): Debian 12's
`torch.distributed.run` fails on Python 3.11, so launch.torchrun_standin runs the
recipe with this instead. It does what torchrun's local agent does for one
node and a static rendezvous, and nothing more:

  --nnodes 1 --nproc-per-node P [--node-rank 0] [--master-addr A]
  [--master-port N] [--max-restarts R] SCRIPT [ARG...]

spawns P workers (`python3 -u SCRIPT ARG...`) with the variables torchrun
sets (RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID). When a worker fails it
stops the others (SIGTERM, then SIGKILL after 5 s, as torchelastic does)
and starts the whole group again, up to R times; exit 0 when every worker
of a group exits 0, else 1. Prints "workers <pid>..." for each group.
"""
import argparse
import os
import signal
import select
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--nnodes", default="1")
ap.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
ap.add_argument("--node-rank", "--node_rank", type=int, default=0)
ap.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
ap.add_argument("--master-port", "--master_port", type=int, default=0)
ap.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
ap.add_argument("script")
ap.add_argument("args", nargs=argparse.REMAINDER)
a = ap.parse_args()
if a.nnodes not in ("1", "1:1") or a.node_rank != 0:
    sys.exit("torchrun_standin: one node only")


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Stopping(Exception):
    pass


def on_term(*_):
    raise Stopping()


signal.signal(signal.SIGTERM, on_term)
for restart in range(a.max_restarts + 1):
    port = a.master_port or free_port()
    procs = []
    for lr in range(a.nproc_per_node):
        env = dict(os.environ, RANK=str(lr), LOCAL_RANK=str(lr), GROUP_RANK="0", ROLE_RANK=str(lr),
                   WORLD_SIZE=str(a.nproc_per_node), LOCAL_WORLD_SIZE=str(a.nproc_per_node),
                   ROLE_WORLD_SIZE=str(a.nproc_per_node), MASTER_ADDR=a.master_addr, MASTER_PORT=str(port),
                   TORCHELASTIC_RESTART_COUNT=str(restart), TORCHELASTIC_MAX_RESTARTS=str(a.max_restarts),
                   TORCHELASTIC_RUN_ID="standin")
        procs.append(subprocess.Popen([sys.executable, "-u", a.script, *a.args], env=env))
    print("workers " + " ".join(str(p.pid) for p in procs), flush=True)
    # Block until a worker exits (its pidfd becomes readable), then look:
    # torchelastic's agent reacts to the first failure the same way.
    fds = {os.pidfd_open(p.pid): p for p in procs}
    failed = False
    try:
        while fds and not failed:
            ready, _, _ = select.select(list(fds), [], [])
            for fd in ready:
                os.close(fd)
                failed |= fds.pop(fd).wait() != 0
    except Stopping:
        stop(procs)
        sys.exit(143)
    finally:
        for fd in fds:
            os.close(fd)
    if not failed:
        sys.exit(0)
    codes = [p.returncode for p in procs]
    stop(procs)
    print(f"torchrun_standin: worker failed {codes}; restart {restart + 1} of {a.max_restarts}", flush=True)
sys.exit(1)
