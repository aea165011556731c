#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`pip install ./integration/python` into a virtual environment that sees
the system's torch (--system-site-packages; Debian's interpreter is
"externally managed"), then, from outside the source tree and without
PYTHONPATH, the installed package saves and restores a model through a real
snapsmp, with libsnap.so given by SNAP_LIBRARY. The package source is copied
first, so pip's in-tree build leaves nothing in the checkout.

usage: test_install.py SOURCE_DIR BUILD_DIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from events import wait_socket  # noqa: E402

src, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
work = os.path.join(build, "tests", "python", "install")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
pkg = os.path.join(work, "pkg")
shutil.copytree(os.path.join(src, "integration", "python"), pkg,
                ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
venv = os.path.join(work, "venv")
env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        sys.exit(1)
    return p.stdout


run([sys.executable, "-m", "venv", "--system-site-packages", venv], env=env)
py = os.path.join(venv, "bin", "python")
run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", pkg], env=env)
store = f"/dev/shm/snaptest-pyinstall-{os.getpid()}"
smp = subprocess.Popen([os.path.join(build, "smp", "snapsmp"), "--store", store, "--quiet"], env=env)
probe = r'''
import os, sys, torch
import libsnap, libsnap.torch as lt
assert libsnap.__file__.startswith(sys.prefix), libsnap.__file__
assert libsnap.crc32c(b"123456789") == 0xE3069283
m = torch.nn.Linear(4, 3)
opt = torch.optim.AdamW(m.parameters())
m(torch.randn(2, 4)).sum().backward()
opt.step()
with lt.Checkpointer(m, opt, job="inst") as ck:
    assert ck.restore() is None
    ck.save(1)
want = {k: v.clone() for k, v in m.state_dict().items()}
m2 = torch.nn.Linear(4, 3)
opt2 = torch.optim.AdamW(m2.parameters())
with lt.Checkpointer(m2, opt2, job="inst") as ck:
    assert ck.restore() == 1
assert all(torch.equal(want[k], v) for k, v in m2.state_dict().items())
print("installed package:", libsnap.__file__, "library:", libsnap.library_path())
'''
try:
    wait_socket(store, smp)
    out = run([py, "-c", probe], cwd=work, env=dict(env, SNAP_STORE=store, SNAP_LIBRARY=os.environ["SNAP_LIBRARY"],
                                                  **({"LD_PRELOAD": os.environ["LD_PRELOAD"]}
                                                     if "LD_PRELOAD" in os.environ else {})))
    print(out.strip())
finally:
    smp.terminate()
    smp.wait()
    shutil.rmtree(store, ignore_errors=True)
shutil.rmtree(work, ignore_errors=True)
print("test_install: all checks passed")
