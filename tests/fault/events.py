# SPDX-License-Identifier: BSD-3-Clause
"""Waiting for the event a fault trial interrupts, without sleeping.

A trial blocks in select() on an inotify descriptor (the log lines, step
directories and MANIFEST renames it waits for are file system events) and on
pidfds of the processes that could die instead, re-checking its predicate
after each wake-up. Nothing here guesses how long work takes; how long to
wait before a kill is derived from a duration the trial measured (see
strike_within).
"""
import ctypes
import os
import random
import select
import socket
import struct
import time

_libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100


class Waiter:
    def __init__(self):
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.watched = set()
        self.wds = {}

    def watch(self, path):
        """Wake on files created, written, closed after writing or renamed into directory `path`
        (a missing one is skipped: watch it again once it exists)."""
        if path in self.watched or not os.path.isdir(path):
            return
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)
        if wd >= 0:
            self.watched.add(path)
            self.wds[wd] = path

    def _drain(self, on_event):
        """Reads every queued event; on_event(dir, mask, name) for each, if given."""
        try:
            while True:
                buf = os.read(self.fd, 65536)
                if not buf:
                    return
                at = 0
                while on_event and at + 16 <= len(buf):
                    wd, mask, _, n = struct.unpack_from("iIII", buf, at)
                    name = buf[at + 16:at + 16 + n].rstrip(b"\0").decode(errors="replace")
                    on_event(self.wds.get(wd), mask, name)
                    at += 16 + n
        except BlockingIOError:
            pass

    def drain(self, on_event=None):
        """Read what is queued now (on_event sees each event), without waiting."""
        self._drain(on_event)

    def until(self, pred, limit=120, dirs=lambda: (), procs=(), on_event=None):
        """pred()'s first true value, or None after `limit` seconds. dirs()
        names directories to watch, asked again after each wake-up (so a
        step directory that appears is watched before pred looks into it);
        a process of `procs` that exits wakes the waiter too. on_event, if
        given, sees every event as (directory, mask, file name) before pred
        is asked again."""
        pidfds = []
        for p in procs:
            try:
                pidfds.append(os.pidfd_open(p.pid))
            except (ProcessLookupError, OSError):
                pass
        deadline = time.monotonic() + limit
        try:
            while True:
                for d in dirs():
                    self.watch(d)
                v = pred()
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                ready, _, _ = select.select([self.fd, *pidfds], [], [], left)
                if self.fd in ready:
                    self._drain(on_event)
                for f in ready:
                    if f in pidfds:   # exited: nothing more to say
                        pidfds.remove(f)
                        os.close(f)
        finally:
            for f in pidfds:
                os.close(f)

    def close(self):
        os.close(self.fd)


def wait_socket(stores, proc, limit=60):
    """Wait until snapsmp serves: <store>/smp.sock exists for every store of
    `stores` (one path or a list: a mesh's nodes). Wakes on the socket's
    creation (inotify on each store, or on its nearest existing ancestor
    until the store exists) or on proc's exit, never on a timer. True when every socket is
    there; False when proc exited first or after `limit` seconds."""
    stores = [stores] if isinstance(stores, str) else list(stores)
    socks = [os.path.join(s, "smp.sock") for s in stores]

    def nearest(d):   # the store, or its nearest existing ancestor until it exists
        while not os.path.isdir(d) and os.path.dirname(d) != d:
            d = os.path.dirname(d)
        return d

    w = Waiter()
    try:
        w.until(lambda: all(map(os.path.exists, socks)) or proc.poll() is not None, limit,
                dirs=lambda: [nearest(s) for s in stores], procs=[proc])
    finally:
        w.close()
    return all(map(os.path.exists, socks))


def strike_within(rng: random.Random, duration):
    """Sleep a random part of `duration`, a time the trial measured for the
    operation it is about to interrupt (a step, a flush, a restore)."""
    time.sleep(rng.uniform(0, duration))


def free_port():
    """A TCP port nobody listens on now (for gloo's MASTER_PORT)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p
