"""``faces``: 64x64 faces from a DCGAN trained on DigiFace1M, the built-in model whose
weights were trained (``submit(model="faces", seed=7, count=8)``).

The generator's code and weights come from the ``gan-face-generate`` wheel (MIT),
installed without its declared dependencies, pinned by version and hash
(``requirements-models.txt``; ``make demo`` and ``make test`` install it). The
checkpoint is checked against :data:`WEIGHTS_SHA256` before torch reads it. The
submitting process imports this module for ``Input`` only: torch, numpy and the
package are imported where the weights load, so only a worker needs them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tasks.errors import ModelError

if TYPE_CHECKING:
    import numpy as np

#: The wheel carrying the generator and its weights, as pinned in requirements-models.txt.
PACKAGE, DISTRIBUTION = "gan_face_generate", "gan-face-generate==1.1.1"
#: sha256 of that wheel's ``weights.tar``: any other file is refused before it is read.
WEIGHTS_SHA256 = "0c3b90b138cfc4e8a73310b9fd5ce2a8f1f3a542a037de277412307fcd28771f"
INSTALL_HINT = ("`make demo` installs it into .venv, or `pip install --no-deps "
                "--require-hashes -r requirements-models.txt`")
#: The checkpoint's architecture: latent size, generator feature maps, colour channels.
NZ, NGF, NC = 100, 64, 3
#: Most faces one job makes; the grid is this many columns wide at most.
MAX_COUNT, GRID_COLUMNS = 16, 4
#: Pixels between faces in the grid, and their grey level.
PAD_PX, PAD_GREY = 2, 32


class FacesInput(BaseModel):
    """One batch of faces. Strict: unknown fields and values of another type are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: Same seed, same faces (on the same kind of device); face i of a seed does not
    #: depend on ``count``.
    seed: int = Field(ge=0, le=2**63 - 1)
    count: int = Field(1, ge=1, le=MAX_COUNT)
    #: Each face upscaled this many times (nearest neighbour): 64 px is small to look at.
    scale: int = Field(1, ge=1, le=4)
    #: One grid image (``image``) or one image per face (``images``).
    grid: bool = True


def weights_path() -> Path:
    """The installed package's checkpoint (``ModelError`` naming it if it is missing)."""
    found = importlib.util.find_spec(PACKAGE)
    if found is None or found.origin is None:
        raise ModelError(f"the faces model needs the {DISTRIBUTION} package (its generator "
                         f"and weights), which is not installed: {INSTALL_HINT}")
    return Path(found.origin).parent / "weights.tar"


def verified_bytes(path: Path, sha256: str = WEIGHTS_SHA256) -> bytes:
    """The contents of ``path``, read once, if their sha256 is ``sha256``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"faces weights {path}: cannot read: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ModelError(f"faces weights {path}: sha256 {digest} is not the pinned "
                         f"{sha256}; reinstall {DISTRIBUTION}: {INSTALL_HINT}")
    return data


def load_generator(path: Path, device: str) -> Any:
    """The DCGAN generator from the checkpoint at ``path``, verified, on ``device``, in
    eval mode (batch norm uses its trained statistics: a face does not depend on the
    batch)."""
    import torch
    from gan_face_generate.models import Generator

    data = verified_bytes(path)  # what torch reads is exactly what was hashed
    checkpoint = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    net = Generator(ngpu=0, nc=NC, nz=NZ, ngf=NGF)
    net.load_state_dict(checkpoint["netG_state_dict"])
    return net.to(device).eval()


def latents(seed: int, count: int) -> list[Any]:
    """``count`` latent vectors drawn in turn from a CPU generator seeded with ``seed``:
    the same on every device, and face i the same whatever ``count`` is."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    return [torch.randn(NZ, 1, 1, generator=rng) for _ in range(count)]  # one draw a face


def grid_of(faces: list[np.ndarray]) -> np.ndarray:
    """The faces (H x W x 3, uint8) in rows of up to ``GRID_COLUMNS``, ``PAD_PX`` apart."""
    import numpy as np

    cols = min(len(faces), GRID_COLUMNS)
    rows = math.ceil(len(faces) / cols)
    h, w, _ = faces[0].shape
    out = np.full((rows * (h + PAD_PX) + PAD_PX, cols * (w + PAD_PX) + PAD_PX, 3),
                  PAD_GREY, dtype=np.uint8)
    for i, face in enumerate(faces):
        top, left = PAD_PX + (i // cols) * (h + PAD_PX), PAD_PX + (i % cols) * (w + PAD_PX)
        out[top:top + h, left:left + w] = face
    return out


class Faces:
    """A DCGAN face generator behind the model contract; see the module docstring."""

    Input: ClassVar[type[FacesInput]] = FacesInput
    deterministic: ClassVar[bool] = True  # seeded: the result cache applies
    version: ClassVar[str] = f"{DISTRIBUTION}@{WEIGHTS_SHA256[:12]}"
    #: The checkpoint to load; None: the installed package's.
    weights: ClassVar[Path | None] = None

    def __init__(self, *, device: str, model_dir: str | Path) -> None:
        self.device = device
        self.net = load_generator(self.weights or weights_path(), device)

    def warmup(self) -> None:
        """One face, so kernels and allocators are hot before the first job."""
        self._face(latents(0, 1)[0])

    def predict(self, inputs: FacesInput, progress: Callable[[int, int], None]) -> dict:
        """``count`` faces of ``seed``: a grid (``image``) or one each (``images``)."""
        faces = []
        for i, z in enumerate(latents(inputs.seed, inputs.count)):
            face = self._face(z)
            faces.append(face.repeat(inputs.scale, axis=0).repeat(inputs.scale, axis=1))
            progress(i + 1, inputs.count)
        shown = {"image": grid_of(faces)} if inputs.grid else {"images": faces}
        return {**shown, "seed": inputs.seed, "count": inputs.count}

    def _face(self, z: Any) -> np.ndarray:
        """One 64x64 RGB face (uint8) from one latent vector."""
        import torch

        with torch.inference_mode():
            out = self.net(z.unsqueeze(0).to(self.device))[0]
        pixels = ((out.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return pixels.permute(1, 2, 0).cpu().numpy()
