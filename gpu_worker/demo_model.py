"""The built-in ``demo`` image generator: a small latent denoiser in plain torch.

Prompt words are hashed into an embedding table and mean-pooled into a
conditioning vector; the seed draws latent noise at a quarter of the image
size; ``steps`` passes of a FiLM-conditioned conv net pull the latent towards
the net's output; a conv decoder upsamples it to RGB. The weights are random
but fixed by the model name, stored and loaded as a sharded checkpoint
exactly like real weights, so the cold-start path is exercised for real.
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gpu_worker.models import Keep, StepCallback
from gpu_worker.shards import load_checkpoint_timed, write_checkpoint
from gpu_worker.store import checkpoint_folder
from tasks.errors import ModelError
from tasks.settings import DEMO_MODEL_MB

VOCAB_SIZE = 4096
COND_DIM = 64
LATENT_CHANNELS = 8
HIDDEN_CHANNELS = 24
DECODE_CHANNELS = 16
LATENT_SCALE = 4  # image side / latent side
N_SHARDS = 4
ARCHITECTURE = "demo-denoiser-v1"

# name -> (shape, init std); conv weights use He-style std so signals keep their scale.
WEIGHT_SPECS: dict[str, tuple[tuple[int, ...], float]] = {
    "embed": ((VOCAB_SIZE, COND_DIM), 1.0),
    "film.weight": ((2 * HIDDEN_CHANNELS, COND_DIM), 0.6 / math.sqrt(COND_DIM)),
    "film.bias": ((2 * HIDDEN_CHANNELS,), 0.1),
    "conv_in.weight": ((HIDDEN_CHANNELS, LATENT_CHANNELS, 3, 3), math.sqrt(2 / (LATENT_CHANNELS * 9))),
    "conv_in.bias": ((HIDDEN_CHANNELS,), 0.1),
    "conv_mid.weight": ((HIDDEN_CHANNELS, HIDDEN_CHANNELS, 3, 3), math.sqrt(2 / (HIDDEN_CHANNELS * 9))),
    "conv_mid.bias": ((HIDDEN_CHANNELS,), 0.1),
    "conv_out.weight": ((LATENT_CHANNELS, HIDDEN_CHANNELS, 3, 3), math.sqrt(2 / (HIDDEN_CHANNELS * 9))),
    "conv_out.bias": ((LATENT_CHANNELS,), 0.1),
    "dec1.weight": ((DECODE_CHANNELS, LATENT_CHANNELS, 3, 3), math.sqrt(2 / (LATENT_CHANNELS * 9))),
    "dec1.bias": ((DECODE_CHANNELS,), 0.1),
    "dec2.weight": ((3, DECODE_CHANNELS, 3, 3), math.sqrt(2 / (DECODE_CHANNELS * 9))),
    "dec2.bias": ((3,), 0.5),
}


def _stable_int(text: str) -> int:
    """A 63-bit hash that, unlike ``hash()``, is the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def make_weights(name: str) -> dict[str, torch.Tensor]:
    """The fixed random weights of model ``name``: same name, same tensors."""
    gen = torch.Generator(device="cpu").manual_seed(_stable_int(f"{ARCHITECTURE}/{name}"))
    return {key: torch.randn(shape, generator=gen) * std
            for key, (shape, std) in WEIGHT_SPECS.items()}


class DemoModel:
    """A device-resident ``demo`` model; see the module docstring."""

    #: It may stop at any step boundary for a fast job, and resume from its latents
    #: there: the same image, bit for bit (``gpu_worker.preempt``).
    preemptible = resumable = True
    #: What it holds, in MB (``gpu_worker.memory``): its weights, rounded up.
    memory_mb = DEMO_MODEL_MB

    def __init__(self, name: str, device: str, weights: dict[str, torch.Tensor],
                 load_ms: float = 0.0, batch_invariant: bool = False) -> None:
        self.name = name
        self.device = device
        self.load_ms = load_ms
        self.w = weights
        # Batch-invariant layers (below) cost ~2.5x on a CPU at 256 px: only a
        # model that batches (GPULANES_MAX_BATCH > 1) needs them, so that a job's
        # image never depends on its batch; the others run the library's kernels.
        self._layers = INVARIANT if batch_invariant else LIBRARY

    def warmup(self) -> None:
        """One tiny generation so kernels and allocators are hot."""
        self.generate("warmup", seed=0, steps=2, width=64, height=64)

    def generate(self, prompt: str, *, seed: int, steps: int, width: int,
                 height: int, on_step: StepCallback | None = None,
                 keep: Keep | None = None,
                 resume: tuple[int, torch.Tensor] | None = None) -> np.ndarray:
        """Return an ``(height, width, 3)`` ``uint8`` image; same inputs, same image.

        ``keep(step, latents)`` gets the latents after each step; ``resume=(step,
        latents)`` starts from them, as if those ``step`` steps had just run: the image
        is bit for bit the one an uninterrupted run gives. A batch of one. With ``batch_invariant`` (a model that batches) the
        single and batched paths are one computation, so a job's image never
        depends on the batch it ran in; with the library kernels it may, in
        the last bits, which is why a model that batches never uses them.
        """
        return self.generate_batch([prompt], [seed], steps=steps, width=width,
                                   height=height, on_step=on_step, keep=keep,
                                   resume=resume)[0]

    def generate_batch(self, prompts: Sequence[str], seeds: Sequence[int], *, steps: int,
                       width: int, height: int, on_step: StepCallback | None = None,
                       keep: Keep | None = None,
                       resume: tuple[int, torch.Tensor] | None = None) -> list[np.ndarray]:
        """One forward pass over the whole batch: latents and conditioning stacked
        along dim 0. With ``batch_invariant``, image ``i`` is bit-for-bit
        ``generate(prompts[i], seed=seeds[i])``; with the library kernels only
        close to it (they choose kernels by batch size)."""
        if steps < 1 or width % 8 or height % 8 or len(prompts) != len(seeds) or not prompts:
            raise ValueError(f"need steps >= 1, sides in multiples of 8 and one seed per "
                             f"prompt, got steps={steps} width={width} height={height} "
                             f"{len(prompts)} prompts, {len(seeds)} seeds")
        with torch.inference_mode():
            cond = torch.stack([self._condition(p) for p in prompts])
            start, x = resume if resume and 0 < resume[0] < steps else (
                0, torch.cat([self._noise(s, width, height) for s in seeds]))
            dt = 1.0 / steps
            for i in range(start, steps):
                # A convex step towards a tanh-bounded target keeps x bounded.
                target = 2.0 * torch.tanh(_blur(self._denoise(x, cond, i / steps), 3))
                x = x - dt * (x - target)  # a new tensor: a kept one stays as it was
                if keep is not None:
                    keep(i + 1, x)
                if on_step is not None:
                    on_step(i)
            rgb = self._decode(x)
        images = (rgb * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return list(images)

    def _condition(self, prompt: str) -> torch.Tensor:
        """Mean of the words' embeddings, rescaled so long prompts steer as hard as short ones."""
        words = re.findall(r"\w+", prompt.lower())
        if not words:
            return torch.zeros(COND_DIM, device=self.device)
        ids = torch.tensor([_stable_int(w) % VOCAB_SIZE for w in words], device=self.device)
        pooled = self.w["embed"][ids].mean(dim=0)
        return pooled * math.sqrt(COND_DIM) / (pooled.norm() + 1e-6)

    def _noise(self, seed: int, width: int, height: int) -> torch.Tensor:
        # Drawn on the CPU whatever the device, so CPU and CUDA start alike.
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shape = (1, LATENT_CHANNELS, height // LATENT_SCALE, width // LATENT_SCALE)
        noise = torch.randn(shape, generator=gen).to(self.device)
        # Smoothed so the seed sets blobs a few latent pixels wide, not speckle.
        noise = _blur(noise, 5)
        return noise / noise.std()

    def _denoise(self, x: torch.Tensor, cond: torch.Tensor, t: float) -> torch.Tensor:
        w = self.w
        linear, conv = self._layers.linear, self._layers.conv
        film = linear(cond + _step_embedding(t, cond.device), w["film.weight"], w["film.bias"])
        scale, shift = film.view(-1, 2, HIDDEN_CHANNELS, 1, 1).unbind(1)
        h = F.silu(conv(x, w["conv_in.weight"], w["conv_in.bias"], padding=1))
        # Dilation widens what one step sees, so patterns grow past pixel noise.
        h = conv(h, w["conv_mid.weight"], w["conv_mid.bias"], padding=2, dilation=2)
        h = F.silu(h * (1 + scale) + shift)
        return conv(h, w["conv_out.weight"], w["conv_out.bias"], padding=1)

    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents -> ``(B, 3, H, W)`` floats in [0, 1]."""
        w = self.w
        h = F.interpolate(x, scale_factor=LATENT_SCALE, mode="bilinear", align_corners=False)
        conv, mean_std = self._layers.conv, self._layers.mean_std
        h = F.silu(conv(h, w["dec1.weight"], w["dec1.bias"], padding=1))
        y = conv(h, w["dec2.weight"], w["dec2.bias"], padding=1)
        # Full contrast per channel keeps the image vivid; a bounded share of
        # the channel means survives as a colour cast that follows the prompt.
        mean, std = mean_std(y)
        y = (y - mean) / (std + 1e-6)
        cast = torch.tanh(mean - self._layers.channel_mean(mean))
        return torch.sigmoid(1.5 * (y + 0.5 * cast))


# --- batch-invariant layers ------------------------------------------------------
# Library conv2d/linear/mean pick kernels (and so summation orders) by batch
# size, so a sample's last bits change with its batch. Each layer below is one
# batched call whose per-sample arithmetic is the same GEMM, of the same shape,
# whatever the batch: torch.bmm runs sample i as its own (rows x K x cols) product.
def batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``(B, in) -> (B, out)``, like ``F.linear``."""
    batch = x.shape[0]
    out = torch.bmm(x.unsqueeze(1), weight.t().expand(batch, *weight.t().shape))
    return out.squeeze(1) + bias


def batch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
               padding: int, dilation: int = 1) -> torch.Tensor:
    """``F.conv2d`` (stride 1, 'same' size) as im2col + one batched GEMM."""
    batch, _, height, width = x.shape
    cols = F.unfold(x, weight.shape[-2:], dilation=dilation, padding=padding)
    kernel = weight.reshape(weight.shape[0], -1)
    out = torch.baddbmm(bias.view(1, -1, 1).expand(batch, -1, cols.shape[-1]),
                        kernel.expand(batch, *kernel.shape), cols)
    return out.view(batch, -1, height, width)


def batch_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over dims 2.. kept as size 1: ``(B, C, ...) -> (B, C, 1, ...)``.

    Summed by halving (elementwise adds in a fixed tree): a reduction kernel
    or a GEMV may split the sum differently for another batch size.
    """
    flat = x.reshape(*x.shape[:2], -1)
    n = flat.shape[-1]
    flat = F.pad(flat, (0, (1 << (n - 1).bit_length()) - n))
    while flat.shape[-1] > 1:
        half = flat.shape[-1] // 2
        flat = flat[..., :half] + flat[..., half:]
    return (flat / n).view(*x.shape[:2], *([1] * (x.dim() - 2)))


def batch_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample, per-channel mean and (unbiased) standard deviation over H and W."""
    mean = batch_mean(x)
    n = x.shape[-1] * x.shape[-2]
    var = batch_mean((x - mean) ** 2) * (n / (n - 1))
    return mean, var.sqrt()


def library_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                 padding: int, dilation: int = 1) -> torch.Tensor:
    return F.conv2d(x, weight, bias, padding=padding, dilation=dilation)


class Layers(NamedTuple):
    """The layers whose kernels decide a sample's last bits."""

    linear: Callable[..., torch.Tensor]
    conv: Callable[..., torch.Tensor]
    mean_std: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    #: ``(B, C, 1, 1) -> (B, 1, 1, 1)``: the mean over channels.
    channel_mean: Callable[[torch.Tensor], torch.Tensor]


LIBRARY = Layers(F.linear, library_conv,
                 lambda y: (y.mean(dim=(2, 3), keepdim=True), y.std(dim=(2, 3), keepdim=True)),
                 lambda m: m.mean(dim=1, keepdim=True))
INVARIANT = Layers(batch_linear, batch_conv, batch_mean_std,
                   lambda m: batch_mean(m.transpose(1, 2)).transpose(1, 2))


def _blur(x: torch.Tensor, size: int) -> torch.Tensor:
    return F.avg_pool2d(x, size, stride=1, padding=size // 2, count_include_pad=False)


def _step_embedding(t: float, device: torch.device) -> torch.Tensor:
    """Sinusoidal embedding of the step's position ``t`` in [0, 1)."""
    freqs = torch.exp(torch.linspace(0.0, math.log(100.0), COND_DIM // 2, device=device))
    angles = t * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)])


def build_checkpoint(name: str, dest: Path) -> Path:
    """Write model ``name``'s checkpoint (4 shards + manifest) to ``dest``."""
    return write_checkpoint(make_weights(name), dest, N_SHARDS,
                            metadata={"model": name, "architecture": ARCHITECTURE})


def load(*, name: str, device: str, model_dir: Path) -> DemoModel:
    """Factory for ``GPULANES_MODELS``: fetch or build the checkpoint, then load it.

    With ``GPULANES_MODEL_STORE`` set the checkpoint comes from that store
    (publish it there with :func:`build_checkpoint`); otherwise it is made
    in ``model_dir`` on first use.
    """
    from tasks.settings import settings

    path = checkpoint_folder(name, model_dir, settings.model_store)
    if not settings.model_store and not path.exists():
        build_checkpoint(name, path)
    # a store-fetched folder was verified shard by shard a moment ago
    weights, load_ms = load_checkpoint_timed(path, device, verify=not settings.model_store)
    for key, (shape, _) in WEIGHT_SPECS.items():
        if key not in weights or tuple(weights[key].shape) != shape:
            raise ModelError(f"{path}: checkpoint does not fit {ARCHITECTURE} (tensor {key!r}); "
                             f"delete {path} to rebuild it")
    return DemoModel(name, device, weights, load_ms,
                     batch_invariant=settings.for_model(settings.max_batch, name) > 1)


#: The factory declares its models' size too: room is made before one loads.
load.memory_mb = DEMO_MODEL_MB  # type: ignore[attr-defined]
