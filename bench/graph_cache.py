"""Does MindSpore's compile cache work here, and what does it save? One process per run, no cluster:

* ``resnet18``: MindCV 0.3's ResNet-18 through ``Model.train`` as MindCV's train.py builds it (as
  bench/mindcv_resnet.py: cosine decay with warm-up, momentum, label smoothing, fixed loss scale,
  BatchNorm), synthetic 32x32 images, batch 2;
* ``loop``: net.py's hand-written loop (``value_and_grad`` of a function over the network's
  parameters, then the optimizer), the docs' sample without the cluster.

For each, ``--repeat`` runs of each mode, in this order: ``none`` (no cache), ``save`` (an empty cache
folder: MindSpore compiles and writes it), ``load`` (the folder ``save`` wrote). Each run prints the
seconds from the first step's call to its end (compile, or load, and one step), the next step's
time, and the losses of 3 steps (seeded: every mode must print the same). Prints a table and exits
1 when a mode's losses differ from ``none``'s (a loaded graph that computes something else).

    .venv/bin/python bench/graph_cache.py [--models resnet18 loop] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("none", "save", "load")
STEPS = 3


def _resnet18() -> list[tuple[float, float]]:
    import mindspore as ms
    import numpy as np
    from mindcv.loss import create_loss
    from mindcv.models import create_model
    from mindcv.optim import create_optimizer
    from mindcv.scheduler import create_scheduler
    from mindcv.utils import create_trainer

    ms.set_seed(1)
    np.random.seed(0)
    net = create_model("resnet18", num_classes=10, pretrained=False)
    lr = create_scheduler(
        4, scheduler="cosine_decay", lr=0.1, min_lr=0.0, warmup_epochs=1, decay_epochs=2, num_epochs=3
    )
    opt = create_optimizer(
        net.trainable_params(), opt="momentum", lr=lr, weight_decay=1e-4, momentum=0.9, loss_scale=1024.0
    )
    loss = create_loss(name="CE", label_smoothing=0.1)
    model = create_trainer(net, loss, opt, None, "O0", None, "fixed", 1024.0)
    x = np.random.rand(2 * STEPS, 3, 32, 32).astype(np.float32)
    y = np.random.randint(0, 10, 2 * STEPS).astype(np.int32)
    data = ms.dataset.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(2)
    out: list[tuple[float, float]] = []

    class Timed(ms.train.Callback):
        def on_train_step_begin(self, run_context: object) -> None:
            self.t = time.perf_counter()

        def on_train_step_end(self, run_context: object) -> None:
            loss_value = run_context.original_args().net_outputs  # type: ignore[attr-defined]
            if isinstance(loss_value, tuple):
                loss_value = loss_value[0]
            out.append((time.perf_counter() - self.t, float(loss_value.asnumpy())))

    model.train(1, data, callbacks=[Timed()], dataset_sink_mode=False)
    return out


def _loop() -> list[tuple[float, float]]:
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_seed(1)

    class Network(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(28 * 28, 10, weight_init="normal", bias_init="zeros")
            self.relu = nn.ReLU()

        def construct(self, x: object) -> object:
            return self.relu(self.fc(self.flatten(x)))

    net = Network()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(net.trainable_params(), 1e-2)

    def forward_fn(inputs: object, target: object) -> tuple[object, object]:
        logits = net(inputs)
        return loss_fn(logits, target), logits

    grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.random((32, 1, 28, 28), dtype=np.float32))
    y = ms.Tensor(np.zeros(32, np.int32))
    out = []
    for _ in range(STEPS):
        t = time.perf_counter()
        (loss, _), grads = grad_fn(x, y)
        optimizer(grads)
        out.append((time.perf_counter() - t, float(loss.asnumpy())))
    return out


def child(model: str) -> None:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    steps = _resnet18() if model == "resnet18" else _loop()
    print(json.dumps({"first_s": steps[0][0], "next_s": steps[1][0], "losses": [v for _, v in steps]}))


def run(model: str, mode: str, cache: Path) -> dict:
    env = dict(os.environ)
    for name in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(name, None)
    if mode == "save":
        shutil.rmtree(cache, ignore_errors=True)
    if mode != "none":
        env.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(cache))
    env["GLOG_v"] = "3"
    p = subprocess.run(
        [sys.executable, __file__, "--child", model],
        env=env,
        cwd=cache.parent,
        capture_output=True,
        text=True,
    )
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
    if p.returncode != 0 or line is None:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:200]}"}
    return json.loads(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--models", nargs="+", choices=("resnet18", "loop"), default=["resnet18", "loop"])
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    import mindspore

    print(
        f"graph-cache benchmark: {shlex_join([sys.executable, *sys.argv])}; MindSpore {mindspore.__version__}"
    )
    bad = False
    with tempfile.TemporaryDirectory(prefix="mscon-bench-graph-cache-") as tmp:
        for model in a.models:
            cache = Path(tmp) / f"cache-{model}"
            got: dict[str, list[dict]] = {m: [] for m in MODES}
            for _ in range(a.repeat):
                for mode in MODES:
                    got[mode].append(run(model, mode, cache))
            reference = next((r["losses"] for r in got["none"] if "losses" in r), None)
            print(f"{model}: seconds from the first step's call to its end (p50 of {a.repeat}); next; losses")
            for mode in MODES:
                ok = [r for r in got[mode] if "first_s" in r]
                errors = [r["error"] for r in got[mode] if "error" in r]
                first = f"{statistics.median(r['first_s'] for r in ok):.2f} s" if ok else "-"
                nxt = f"{statistics.median(r['next_s'] for r in ok):.3f} s" if ok else "-"
                same = all(r["losses"] == reference for r in ok)
                bad |= not same or bool(errors)
                losses = ok[0]["losses"] if ok else []
                verdict = "same losses" if same else "LOSSES DIFFER"
                print(
                    f"  {mode:<5} first step {first:>8}, next {nxt}, {verdict} {losses}"
                    + (f"; {errors}" if errors else "")
                )
    return 1 if bad else 0


def shlex_join(args: list[str]) -> str:
    import shlex

    return shlex.join(args)


if __name__ == "__main__":
    sys.exit(main())
