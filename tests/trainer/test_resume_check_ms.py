"""The resume check (``python -m mscon_resume.check``, issue 42) on a real MindSpore loop: a
hand-written loop over ``mscon_resume.batches`` resumes exactly, with the runs forked from one
process that imported MindSpore and as fresh processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_mindspore

LOOP = """\
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mscon_resume

ms.set_seed(1)
rs = np.random.RandomState(0)
x = rs.randn(64, 4).astype(np.float32)
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(8)
net = nn.Dense(4, 1)
opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
loss_fn = nn.MSELoss()


def forward(a, b):
    return loss_fn(net(a), b)


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward, None, opt.parameters))
for epoch in range(3):
    for i, (a, b) in mscon_resume.batches(data, epoch, keep=(net, opt)):
        loss, grads = grad_fn(a, b)
        opt(grads)
        if i % 4 == 0:
            print(f"epoch {epoch} batch {i} loss {float(loss.asnumpy()):.6f}")
print("done")
"""


@needs_mindspore
@pytest.mark.mindspore(ranks=1)
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_a_loop_over_batches_resumes_exactly(tmp_path: Path, fork: bool) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    # 24 steps (3 epochs of 8 batches): killed at 10, in the second epoch.
    cmd = [sys.executable, "-m", "mscon_resume.check", *(["--fork"] if fork else []), "--", script.name]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("resumes exactly (rank 0 resumed after step "), done.stdout
    assert "uninterrupted: exit 0, last step 24" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.py"]  # the runs' folder went
