# SPDX-License-Identifier: BSD-3-Clause
"""One way to damage a file, shared by the corruption trials (heal_trials.py
on one node, mesh_heal.py on a mesh)."""
import os


def damage_file(rng, path, what, flips=1):
    """Damages path: "flip" (flips random bits, one per flip), "zero" (a
    4 KiB page of zeros), "truncate" (to a random length) or "delete".
    Returns what."""
    size = os.path.getsize(path)
    if what == "flip":
        for _ in range(flips):
            off = rng.randrange(size)
            with open(path, "r+b") as f:
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    elif what == "zero":
        off = rng.randrange(max(1, size // 4096)) * 4096
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(min(4096, size - off)))
    elif what == "truncate":
        os.truncate(path, rng.randrange(size))
    elif what == "delete":
        os.unlink(path)
    return what
