"""GRAPH_MODE: a GAN-like pair, generator and discriminator each with its own nn.Adam, given as a keep
dict (each object named); a user would be let down if the pair did not both continue where they
stopped.

EXPECT: exact
PATTERN: 4
SUITE: slow
"""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops

import mscon_resume

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(1)


class Generator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.generate = nn.SequentialCell(nn.Dense(2, 8), nn.ReLU(), nn.Dense(8, 4))

    def construct(self, z):
        return self.generate(z)


class Discriminator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.judge = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))

    def construct(self, x):
        return self.judge(x)


rng = np.random.default_rng(0)
real = (rng.standard_normal((64, 4)) * 0.5 + 1.0).astype(np.float32)
latent = rng.standard_normal((64, 2)).astype(np.float32)
dataset = ds.NumpySlicesDataset({"real": real, "z": latent}, shuffle=True).batch(8)
g, d = Generator(), Discriminator()
opt_g = nn.Adam(g.trainable_params(), 0.01)
opt_d = nn.Adam(d.trainable_params(), 0.01)
bce = nn.BCEWithLogitsLoss()


def d_forward(real, z):
    fake = ops.stop_gradient(g(z))
    real_logits, fake_logits = d(real), d(fake)
    return bce(real_logits, ops.ones_like(real_logits)) + bce(fake_logits, ops.zeros_like(fake_logits))


def g_forward(z):
    fake_logits = d(g(z))
    return bce(fake_logits, ops.ones_like(fake_logits))


d_grad = mscon_resume.track_loss(ms.value_and_grad(d_forward, None, opt_d.parameters))
g_grad = ms.value_and_grad(g_forward, None, opt_g.parameters)

kept = {"g": g, "d": d, "opt_g": opt_g, "opt_d": opt_d}
for epoch in range(5):  # 40 steps: compiled steps are quick, the check kills a few steps late
    for i, (real, z) in mscon_resume.batches(dataset, epoch, keep=kept):
        d_loss, grads = d_grad(real, z)
        opt_d(grads)
        g_loss, grads = g_grad(z)
        opt_g(grads)
        print(f"epoch {epoch} step {i} loss {float(d_loss):.8f} g_loss {float(g_loss):.8f}")
print("training finished")
