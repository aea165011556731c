#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A private SLURM cluster of fake nodes on this machine, for the launch tests.

Debian's slurmd is built with multiple-slurmd support, so one host can pose
as several nodes: NodeName=n[1-N] NodeHostname=localhost NodeAddr=127.0.0.1
Port=[P+1..P+N], one `slurmd -N nX` each. Everything lives in one directory:
its own munge key and socket, slurm.conf, state, spool, logs, and per node a
TmpFS (PMIx's directories would clash on a shared one). Clients find it
through SLURM_CONF (cluster.env). Needs root (slurmd runs jobs as their
users) and the Debian packages slurmd, slurmctld, slurm-client and munge.

Settings that matter on one host (docs/deploy.md, "SLURM"):
  proctrack/linuxproc and task/none: no cgroups to set up or share;
  SlurmdParameters=config_overrides: the fake nodes claim CPUs they share;
  ReturnToService=1: a node an operator marks down stays down until
  resumed (the node-failure drill resumes it as the replacement).

Every daemon runs in the foreground as a child of this process and is
stopped by its pid (SIGTERM, then SIGKILL after a grace).

  slurm_cluster.py start DIR [--nodes N]   start, print the environment, return
  slurm_cluster.py stop DIR                stop what start left running
"""
import argparse
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

PKGS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client",
        "sbatch": "slurm-client", "scontrol": "slurm-client"}


def missing():
    """Why a cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "not root (slurmd and munged need it)"
    gone = sorted({p for b, p in PKGS.items() if not shutil.which(b)})
    if gone:
        return "packages missing: " + " ".join(gone) + " (scripts/install-deps.sh)"
    return None


def free_ports(n):
    """n consecutive TCP ports that nobody listens on now (slurm.conf takes a range)."""
    for base in range(17000, 60000, 97):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class Cluster:
    def __init__(self, root, nodes=4, cpus=4):
        self.root = os.path.abspath(root)
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.procs = {}
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def _write_conf(self):
        r = self.root
        base = free_ports(len(self.nodes) + 1)
        n = len(self.nodes)
        for d in ("state", "spool", "log", "munge", "tmp"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        for node in self.nodes:
            os.makedirs(os.path.join(r, "spool", node), exist_ok=True)
            os.makedirs(os.path.join(r, "tmp", node), exist_ok=True)
        os.chmod(os.path.join(r, "munge"), 0o700)
        with open(self.conf, "w") as f:
            f.write(f"""# A private test cluster (tests/launch/slurm_cluster.py)
ClusterName=snaptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={base}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket.2
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
TmpFS={r}/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=1
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=300
InactiveLimit=0
MessageTimeout=20
NodeName={self.nodes[0][0]}[1-{n}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[{base + 1}-{base + n}] CPUs={self.cpus} RealMemory=4096 State=UNKNOWN
PartitionName=test Nodes={self.nodes[0][0]}[1-{n}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        with open(os.path.join(r, "cluster.env"), "w") as f:
            f.write(f"export SLURM_CONF={self.conf}\n")

    def _spawn(self, name, argv):
        log = open(os.path.join(self.root, "log", name + ".out"), "w")
        p = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = p
        with open(os.path.join(self.root, name + ".fgpid"), "w") as f:
            f.write(f"{p.pid}\n")
        return p

    def start(self, limit=60):
        why = missing()
        if why:
            raise RuntimeError(why)
        os.makedirs(self.root, exist_ok=True)
        self._write_conf()
        key = os.path.join(self.root, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(self.root, "munge", "munge.socket.2")
        self._spawn("munged", ["munged", "-F", "-f", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={self.root}/munge/munged.pid",
                               f"--log-file={self.root}/log/munged.log",
                               f"--seed-file={self.root}/munge/munged.seed"])
        self._until(lambda: os.path.exists(sock), limit, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self._until(lambda: subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True).returncode == 0,
                    limit, "slurmctld to answer scontrol ping")
        for node in self.nodes:
            self._spawn("slurmd." + node, ["slurmd", "-D", "-N", node, "-f", self.conf])
        self._until(lambda: self.states() == {n: "idle" for n in self.nodes}, limit, "every node idle")
        return self

    def states(self):
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True)
        out = {}
        for ln in r.stdout.splitlines():
            p = ln.split()
            if len(p) == 2:
                out[p[0]] = p[1].rstrip("*~#!%$@^-")
        return out

    def _until(self, pred, limit, what):
        # Daemons that start have no event to wait on but their answer: asked
        # again every 0.1 s under one generous deadline.
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if pred():
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what} (logs in {self.root}/log)")
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what} (logs in {self.root}/log)")

    def stop(self):
        """SIGTERM every daemon (slurmds first), then SIGKILL what is left after a grace."""
        order = [n for n in self.procs if n.startswith("slurmd.")] + ["slurmctld", "munged"]
        for n in order:
            p = self.procs.get(n)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for n in order:
            p = self.procs.get(n)
            if not p:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def stop_dir(root):
    """Stop the daemons a `start` in another process left (their pids are in ROOT/*.fgpid)."""
    pids = []
    for n in sorted(os.listdir(root)):
        if n.endswith(".fgpid"):
            with open(os.path.join(root, n)) as f:
                pids.append(int(f.read()))
    # Each daemon's exit is the event: a pidfd becomes readable when it is
    # gone; what is left after one grace period is SIGKILLed.
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    while fds and time.monotonic() < deadline:
        for fd in select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))[0]:
            os.close(fd)
            del fds[fd]
    for fd, pid in fds.items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["start", "stop"])
    ap.add_argument("dir")
    ap.add_argument("--nodes", type=int, default=4)
    a = ap.parse_args()
    if a.cmd == "stop":
        stop_dir(a.dir)
        return 0
    why = missing()
    if why:
        print("slurm_cluster: " + why, file=sys.stderr)
        return 77
    c = Cluster(a.dir, a.nodes)
    try:
        c.start()
    except RuntimeError as e:
        print(f"slurm_cluster: {e}", file=sys.stderr)
        c.stop()
        return 1
    # The daemons outlive this process (own sessions); `stop DIR` ends them.
    print(f"export SLURM_CONF={c.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
