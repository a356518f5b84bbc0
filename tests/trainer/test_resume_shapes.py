"""mscon_resume's two shapes in one process without a cluster (plain ``python``, real MindSpore): a
hand-written loop over ``mscon_resume.batches`` and ``Model.train`` with ``ResumeCallback``, each
killed (SIGKILL) after global step 13 and relaunched with ``MSCON_RESUME=1``: it resumes after
step 13, computes the losses the uninterrupted run computed, and drops its snapshots at the end.
Over sshd nodes and msrun with real ranks: tests/e2e/test_user_resume.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_mindspore

from mscon_resume import store

KILL_AFTER = 13  # global steps done when the first launch kills itself (8 batches an epoch: epoch 2, batch 5)
STEPS = 24  # 3 epochs of 64 samples in batches of 8

# A tiny job: nn.Dense on 64 random samples, shuffled, batch 8, 3 epochs, seeded as the docs say.
COMMON = (
    f"KILL_AFTER = {KILL_AFTER}\n"
    + """
import os, signal, sys
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
import mscon_resume

ms.set_seed(1)


class Samples:
    def __init__(self):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((64, 4)).astype(np.float32)
        self.y = (self.x.sum(axis=1) > 0).astype(np.int32)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


data_set = ds.GeneratorDataset(Samples(), ["data", "label"], shuffle=True).batch(8)
net = nn.Dense(4, 2)
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
KILL = os.environ.get("MSCON_RESUME") is None and sys.argv[1:] != ["uninterrupted"]


def die():
    print("killing myself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""
)

LOOP = (
    COMMON
    + """
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def forward_fn(data, label):
    logits = net(data)
    return loss_fn(logits, label), logits


grad_fn = mscon_resume.track_loss(ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True))
size = data_set.get_dataset_size()
for epoch in range(3):
    for i, (data, label) in mscon_resume.batches(data_set, epoch, keep=(net, optimizer)):
        step = epoch * size + i + 1
        if KILL and step == KILL_AFTER + 1:
            # Step KILL_AFTER is done and its snapshot handed over when the loop asks for the next
            # batch; the fault comes once it is written (as the trainer's --die-at-step does).
            mscon_resume.loop._DEFAULT.core.settle()
            die()
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        print("step %d loss %r" % (step, float(loss.asnumpy())), flush=True)
print("training finished", flush=True)
"""
)

MODEL = (
    COMMON
    + """
from mindspore.train import Callback, LossMonitor, Model

loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
resume = mscon_resume.ResumeCallback(data_set)


class Die(Callback):
    def on_train_step_end(self, run_context):
        if KILL and int(run_context.original_args().cur_step_num) == KILL_AFTER:
            resume.core.settle()  # ResumeCallback (before this one) handed the step over
            die()


model.train(
    3,
    data_set,
    callbacks=[LossMonitor(), resume, Die()],
    dataset_sink_mode=False,
    initial_epoch=resume.initial_epoch,
)
print("training finished", flush=True)
"""
)


def _launch(
    script: Path, state: Path, *, resume: bool = False, args: tuple[str, ...] = ()
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    env["MSCON_STATE_DIR"] = str(state)
    env.setdefault("GLOG_v", "3")
    if resume:
        env["MSCON_RESUME"] = "1"
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=script.parent,  # not the repository: the installed mscon_resume is the one imported
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(p: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return p.returncode, out, err


def _snapshot_folders(state: Path) -> list[str]:
    names = store.alternates(store.shm_folder(str(state))) + store.alternates(str(state / "snapshots"))
    return [n for n in names if os.path.lexists(n)]


def _kill_and_resume(tmp_path: Path, source: str, stage: str) -> tuple[str, str]:
    """(the uninterrupted run's output, the relaunch's), after checking the killed launch."""
    script = tmp_path / "job.py"
    script.write_text(source)
    state = tmp_path / "state"
    # The uninterrupted run and the first launch side by side: different state folders.
    alone = _launch(script, tmp_path / "alone-state", args=("uninterrupted",))
    first = _launch(script, state)
    rc_alone, ref, ref_err = _done(alone)
    rc_first, out, err = _done(first)
    assert rc_alone == 0, ref_err[-3000:]
    assert rc_first == -signal.SIGKILL, (out[-2000:], err[-3000:])
    kept = _snapshot_folders(state)
    assert kept, "no snapshot folder after the kill"
    found = sorted(p.name for p in Path(kept[0], "rank_0", stage).glob("snap_*.msnap"))  # each stage its own
    assert found == [f"snap_{KILL_AFTER - 1}.msnap", f"snap_{KILL_AFTER}.msnap"]
    rc, again, err = _done(_launch(script, state, resume=True))
    assert rc == 0, (again[-2000:], err[-3000:])
    assert f"mscon_resume: rank 0 resumes after step {KILL_AFTER} (snapshot saved" in again, again[-2000:]
    assert "training finished" in again
    assert _snapshot_folders(state) == []  # a finished run drops its snapshots (and the folder)
    assert _snapshot_folders(tmp_path / "alone-state") == []
    return ref, again


@pytest.mark.mindspore
@needs_mindspore
def test_a_hand_written_loop_resumes_after_its_last_step(tmp_path: Path) -> None:
    ref, again = _kill_and_resume(tmp_path, LOOP, "loop0")
    line = re.compile(r"^step (\d+) loss (\S+)$", re.M)
    want = {int(s): x for s, x in line.findall(ref)}
    got = {int(s): x for s, x in line.findall(again)}
    assert sorted(want) == list(range(1, STEPS + 1))
    assert sorted(got) == list(range(KILL_AFTER + 1, STEPS + 1))  # nothing done twice, nothing left out
    assert got == {s: want[s] for s in got}


@pytest.mark.mindspore
@needs_mindspore
def test_model_train_with_the_callback_resumes_after_its_last_step(tmp_path: Path) -> None:
    ref, again = _kill_and_resume(tmp_path, MODEL, "callback0")
    line = re.compile(r"^epoch: (\d+) step: (\d+), loss is (\S+)$", re.M)
    per_epoch = STEPS // 3
    want = {(int(e) - 1) * per_epoch + int(s): x for e, s, x in line.findall(ref)}
    got = {(int(e) - 1) * per_epoch + int(s): x for e, s, x in line.findall(again)}
    assert sorted(want) == list(range(1, STEPS + 1))
    assert sorted(got) == list(range(KILL_AFTER + 1, STEPS + 1))
    assert got == {s: want[s] for s in got}
