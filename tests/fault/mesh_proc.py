#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The erasure-coded mesh as processes, for the fault tests and
scripts/bench_levels.py: `mpirun -np NODES snapsmp --ec K+M` in a session of
its own (Open MPI moves ranks into process groups of their own, so it is
signalled and killed by its session), its log, its stop, and what a
SIGKILLed mpirun leaves behind (shared-memory segments, session folders)."""
import glob
import os
import select
import shutil
import signal
import subprocess
import time

from events import Waiter, wait_socket


def mpi_jobid(pids):
    """Open MPI's job id, from a running rank's environment (None if unread)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(b"OMPI_MCA_ess_base_jobid="):
                        return int(kv.split(b"=", 1)[1])
        except (OSError, ValueError):
            pass
    return None


def remove_mpi_segments(jobid):
    """A SIGKILLed Open MPI job leaves its shared-memory segments behind
    (/dev/shm/vader_segment.HOST.UID.JOBID.RANK; only a clean exit removes
    them): a CI run of the fault tests used to leave about a thousand."""
    if jobid is None:
        return
    for p in glob.glob(f"/dev/shm/vader_segment.*.{os.geteuid()}.{jobid:x}.*"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


class Mesh:
    def __init__(self, a, base, extra=()):
        self.a, self.base, self.proc, self.logf = a, base, None, None
        self.extra = list(extra)   # more snapsmp flags (mesh_flush.py: --flush-dir ...)

    def root(self, n):
        return os.path.join(self.base, f"node{n}")

    def sanitizer_errors(self):
        t = self.text() if getattr(self, "log", None) else ""
        return "AddressSanitizer" in t or "runtime error:" in t or "LeakSanitizer" in t

    def start(self, log, wait=True):
        """wait False: return once mpirun runs (the caller waits on what it needs)."""
        if getattr(self, "log", None) and self.sanitizer_errors():
            raise RuntimeError(f"sanitizer report in {self.log}")
        # mpirun's session directory (PMIx stores, 8 MiB a launch) goes where
        # kill() can remove it: a SIGKILLed mpirun leaves it, and /tmp held
        # 48 GB of them after two days of test runs on the dev machine.
        self.mpitmp = os.path.join(self.base, "mpi-session")
        os.makedirs(self.mpitmp, exist_ok=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_orte_tmpdir_base=self.mpitmp)
        self.log = log
        self.logf = open(log, "w")
        # A killed node leaves its socket file: only a fresh one means "serving"
        # (and the relaunch recovery runs before the socket is bound).
        for n in range(self.a.nodes):
            try:
                os.unlink(os.path.join(self.root(n), "smp.sock"))
            except FileNotFoundError:
                pass
        # Own session: SIGKILL of the process group takes mpirun and every node.
        self.proc = subprocess.Popen(
            [self.a.mpiexec, "-np", str(self.a.nodes), "--oversubscribe", self.a.snapsmp, "--ec", self.a.shape,
             "--store", os.path.join(self.base, "node%n"), "--slots", "3", "--mem-limit", "256M"] + self.extra,
            env=env, stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait:
            return
        if not wait_socket([self.root(n) for n in range(self.a.nodes)], self.proc, limit=120):
            raise RuntimeError(f"mesh did not start; see {log}")
        # Nodes whose copy was intact serve while their mesh thread still
        # rebuilds the others: the checks of rebuilt files wait for every
        # node's end of the recovery (unless --quiet hides the line).
        if "--quiet" not in self.extra and not self.wait_recovered(log):
            raise RuntimeError(f"mesh did not finish its relaunch recovery; see {log}")

    def wait_recovered(self, log, limit=120):
        w = Waiter()
        w.watch(os.path.dirname(log))

        def done():
            with open(log, errors="replace") as f:
                return f.read().count("recovery done; agreement rounds running") >= self.a.nodes
        try:
            w.until(lambda: done() or self.proc.poll() is not None, limit, procs=[self.proc])
        finally:
            w.close()
        return done()

    def session(self):
        """Pids in mpirun's session: Open MPI moves ranks to their own process
        groups, but they stay in the session this test created."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            # a zombie is signalled no more (its parent, a stopped mpirun, reaps it later)
            if int(fields[3]) == self.proc.pid and int(d) != self.proc.pid and fields[0] != "Z":
                out.append(int(d))
        return out

    def signal_all(self, sig):
        for pid in self.session():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        if self.proc and self.proc.poll() is None:
            # mpirun first, stopped: seeing one rank die, it SIGTERMs the
            # others, which then shut down cleanly (flushing captured files,
            # finishing a flush) instead of dying with the rest. Seen under
            # ASan beside a parallel build: mesh_capture's quiet phase found
            # files flushed to the real directories by "SIGKILLed" nodes.
            try:
                os.kill(self.proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            pids = self.session()
            jobid = mpi_jobid(pids)
            # Wait until every rank has exited (ranks hold store locks): a pidfd
            # becomes readable once the process's whole thread group is gone; a
            # killed daemon's leader is a zombie at once while its other threads
            # still close its files and free its memory.
            fds = []
            for pid in pids:
                try:
                    fds.append(os.pidfd_open(pid))
                except OSError:
                    pass
            self.signal_all(signal.SIGKILL)
            deadline = time.monotonic() + 10
            while fds and deadline > time.monotonic():
                for f in select.select(fds, [], [], deadline - time.monotonic())[0]:
                    fds.remove(f)
                    os.close(f)
            for f in fds:
                os.close(f)
            self.proc.kill()
            remove_mpi_segments(jobid)
        if self.proc:
            self.proc.wait()
            shutil.rmtree(self.mpitmp, ignore_errors=True)
        if self.logf:
            self.logf.close()
        self.proc = None

    def stop(self):
        """SIGTERM: every node must shut down cleanly (threads joined, exit 0).
        The nodes get it, not mpirun: Open MPI's mpirun answers SIGTERM by
        forwarding it and SIGKILLing the ranks about a second later, which cut
        a slow node's shutdown flush short (seen in CI: mesh_capture, node 5
        flushed 1 of its 4 captured files). mpirun exits once every rank has."""
        for pid in self.session():
            if pid != self.proc.pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        rc = self.proc.wait(timeout=120)
        self.logf.close()
        self.proc = None
        return rc

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()
