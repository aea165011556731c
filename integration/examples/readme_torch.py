# SPDX-License-Identifier: BSD-3-Clause
# The libsnap.torch example of README.md, complete:
#   PYTHONPATH=integration/python python3 integration/examples/readme_torch.py   (snapsmp running)
import torch

import libsnap.torch

torch.manual_seed(0)
model = torch.nn.Linear(64, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
x, y = torch.randn(256, 64), torch.randn(256, 8)

ckpt = libsnap.torch.Checkpointer(model, optimizer, extra={"sched": sched})
start = (ckpt.restore() or 0) + 1        # newest step every rank committed; None: fresh start
for step in range(start, start + 50):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()                     # waits for the last snapshot's copy first (the fence)
    sched.step()
    ckpt.save(step)                      # returns at once; the copy runs behind the next step
print(f"steps {start}-{step}, loss {loss.item():.6f}")
ckpt.close()
