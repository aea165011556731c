# SPDX-License-Identifier: BSD-3-Clause
"""One saver per checkpointing kind (none, libsnap.torch, DCP async_save,
torch.save), each with the same save/probe/close calls."""
import ctypes
import os
import shutil
import time

import torch

from .model import JOB
from .measure import du


# ---- savers: one per checkpointing kind --------------------------------------

class Skip(Exception):
    """A mode this torch cannot run (said in the JSON and on stderr)."""


class NoSave:
    kind = "none"

    def save(self, step):
        pass

    def finish(self):
        pass

    def probe(self, step):
        return None

    def pinned(self):
        return None

    def close(self):
        pass

    def bytes_on_shm(self):
        return 0


class SnapSave(NoSave):
    kind = "libsnap"

    def __init__(self, model, opt, store, codec, device, copy_threads):
        import libsnap.torch
        more = {"copy_threads": copy_threads} if copy_threads else {}
        self.ck = libsnap.torch.Checkpointer(model, opt, job=JOB, store=store, codec=codec, fence_forward=False,
                                             **more)
        self.copy_threads = self.ck.settings["copy_threads"]
        self.store, self.cuda = store, device.type == "cuda"

    def save(self, step):
        self.ck.save(step)

    def finish(self):
        self.ck.wait()

    def probe(self, step):
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.ck.save(step)
        self.ck.wait()
        return time.perf_counter() - t0

    def pinned(self):
        from libsnap import _capi as C
        L = C.lib()
        L.snap_pinned.restype, L.snap_pinned.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        v = ctypes.c_uint64()
        return int(v.value) if L.snap_pinned(self.ck._ctx.h, ctypes.byref(v)) == 0 else None

    def bytes_on_shm(self):
        return du(self.store)

    def close(self):
        self.ck.close()


def dcp_api():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as e:
        raise Skip(f"torch {torch.__version__} has no torch.distributed.checkpoint ({e})")
    if not hasattr(dcp, "async_save"):
        raise Skip(f"torch {torch.__version__}'s torch.distributed.checkpoint has no async_save")
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    except ImportError as e:
        raise Skip(f"torch {torch.__version__} has no torch.distributed.checkpoint.state_dict ({e})")
    return dcp, get_state_dict, set_state_dict


def dcp_writer(dcp, path):
    """FileSystemWriter, with its pinned staging cache where it has one
    (what DCP's async tutorial recommends for repeated saves)."""
    W = dcp.FileSystemWriter
    try:
        return W(path, cache_staged_state_dict=True), "FileSystemWriter(cache_staged_state_dict=True)"
    except TypeError:
        return W(path), "FileSystemWriter"


class DcpSave(NoSave):
    kind = "dcp"

    def __init__(self, model, opt, root):
        self.dcp, self.get_sd, _ = dcp_api()
        self.model, self.opt, self.root = model, opt, root
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        self.fut = None
        self.done_at = {}      # step -> perf_counter when its save completed
        self.issued = {}
        self.writer = self.writer_kind = None
        self.errors = []

    def _resolve(self, r):
        # newer torch returns AsyncSaveResponse(staging_completion, upload_completion)
        return getattr(r, "upload_completion", r)

    def save(self, step):
        if self.fut is not None:
            self.fut.result()
        msd, osd = self.get_sd(self.model, self.opt)
        path = os.path.join(self.root, f"step-{step:08d}")
        if self.writer is None:    # one writer for every save: its staging cache is reused
            self.writer, self.writer_kind = dcp_writer(self.dcp, path)
        self.issued[step] = time.perf_counter()
        f = self._resolve(self.dcp.async_save({"model": msd, "optim": osd}, storage_writer=self.writer,
                                              checkpoint_id=path))

        def done(_f, step=step):
            self.done_at[step] = time.perf_counter()
            # keep the newest checkpoint only, off the training thread
            for d in os.listdir(self.root):
                if d < f"step-{step:08d}":
                    shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)
            try:
                _f.result()
            except Exception as e:
                self.errors.append(repr(e))
        f.add_done_callback(done)
        self.fut = f

    def finish(self):
        if self.fut is not None:
            self.fut.result()
        if self.errors:
            raise RuntimeError("dcp.async_save failed: " + self.errors[0])

    def probe(self, step):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.save(step)
        self.finish()
        return time.perf_counter() - t0

    def commits(self):
        return [self.done_at[s] - self.issued[s] for s in self.done_at if s in self.issued]

    def bytes_on_shm(self):
        return du(self.root)

    def close(self):
        self.finish()


class TorchSave(NoSave):
    kind = "torch.save"

    def __init__(self, model, opt, path):
        self.model, self.opt, self.path = model, opt, path

    def save(self, step):
        tmp = self.path + ".tmp"
        torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, self.path)

    def probe(self, step):
        t0 = time.perf_counter()
        self.save(step)
        return time.perf_counter() - t0

    def bytes_on_shm(self):
        return du(self.path) if os.path.exists(self.path) else 0

    def close(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
