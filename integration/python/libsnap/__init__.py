# SPDX-License-Identifier: BSD-3-Clause
"""libsnap: crash-safe, asynchronous snapshots of a training job's state into
node memory held by snapsmp (see the project README). This package binds the
C library libsnap.so with ctypes; `libsnap.torch` is the PyTorch integration.

    import libsnap.torch
    with libsnap.torch.Checkpointer(model, optimizer, extra={"sched": sched}) as ckpt:
        start = (ckpt.restore() or 0) + 1
        for step in range(start, steps + 1):
            loss = train_step()          # optimizer.step() fences by itself
            ckpt.save(step)              # returns at once

The library is found through $SNAP_LIBRARY, beside this package, in the
build tree it sits in, or on the loader's path (libsnap._capi).
"""
from ._capi import SnapError, MismatchError, library_path, crc32c

__all__ = ["SnapError", "MismatchError", "library_path", "crc32c"]

__version__ = "0.3.0"
