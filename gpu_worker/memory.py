"""What a model holds and what a worker may hold: sizes in MB, the device's budget.

A model declares its size with a class attribute, ``memory_mb: ClassVar[int | None]``
(an image model's factory may return an object that has one); a model that declares
none is measured once loaded: the bytes of the torch tensors it holds (its modules'
parameters and buffers, tensors in its attributes), or on CUDA the memory allocated
during its load, whichever is more. A worker's budget is its device's free memory at
start less a margin (CUDA), else ``GPULANES_MODEL_MEMORY_MB``.
"""
from __future__ import annotations

import math
import sys
import types
from typing import Any, Callable, Iterable, Mapping

from tasks.errors import ConfigError
from tasks.jobs.catalog import declared_mb

__all__ = ["declared_mb", "tensor_bytes", "to_mb", "cuda_allocated", "device_budget_mb",
           "default_warm", "check_warm"]

MB = 1024 * 1024
#: Of a GPU's free memory at start, what is kept back from models: activations, the
#: CUDA context's growth, the allocator's fragmentation. The larger of the two.
VRAM_MARGIN_MB, VRAM_MARGIN_SHARE = 1024, 0.10
#: How deep the attributes of a model are searched for tensors (a pipeline holds its
#: modules one or two objects down).
SEARCH_DEPTH = 3


def tensor_bytes(model: Any) -> int:
    """Bytes of the torch tensors ``model`` holds, each counted once."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    seen: dict[int, int] = {}
    _collect(model, torch, seen, set(), SEARCH_DEPTH)
    return sum(seen.values())


def _collect(obj: Any, torch: Any, seen: dict[int, int], visited: set[int],
             depth: int) -> None:
    if id(obj) in visited or depth < 0:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        seen[obj.data_ptr() or id(obj)] = obj.numel() * obj.element_size()
    elif isinstance(obj, torch.nn.Module):
        for tensor in (*obj.parameters(), *obj.buffers()):
            seen[tensor.data_ptr() or id(tensor)] = tensor.numel() * tensor.element_size()
    elif isinstance(obj, Mapping):
        for value in obj.values():
            _collect(value, torch, seen, visited, depth - 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _collect(value, torch, seen, visited, depth - 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)):
        for value in vars(obj).values():
            _collect(value, torch, seen, visited, depth - 1)


def to_mb(nbytes: int) -> int:
    """Whole MB, rounded up; at least 1."""
    return max(1, math.ceil(nbytes / MB))


def cuda_allocated(device: str) -> int:
    """Bytes torch has allocated on ``device`` (0 off CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_allocated(device))


def device_budget_mb(device: str, cpu_budget_mb: int) -> int:
    """What models may take on ``device``: a GPU's free memory now, less the margin
    (the larger of ``VRAM_MARGIN_MB`` and ``VRAM_MARGIN_SHARE`` of it), else the CPU
    budget (``GPULANES_MODEL_MEMORY_MB``)."""
    if not device.startswith("cuda"):
        return cpu_budget_mb
    import torch

    free, total = torch.cuda.mem_get_info(device)
    margin = max(VRAM_MARGIN_MB * MB, VRAM_MARGIN_SHARE * total)
    return max(1, int((free - margin) // MB))


def default_warm(names: Iterable[str], size_of: Callable[[str], int | None],
                 budget_mb: int) -> tuple[str, ...]:
    """The models warmed when GPULANES_WARM_MODELS is unset: ``names`` in order while
    their declared sizes fit ``budget_mb`` together. The first that does not fit ends
    the set, and so does one that declares no size (kept when it is the first: its
    size is measured as it loads)."""
    chosen: list[str] = []
    used = 0
    for name in names:
        size = size_of(name)
        if size is None:
            return tuple(chosen) or (name,)
        if used + size > budget_mb:
            break
        chosen.append(name)
        used += size
    return tuple(chosen)


def check_warm(sizes: Mapping[str, int | None], budget_mb: int, budget_from: str) -> None:
    """``ConfigError`` naming GPULANES_WARM_MODELS when the warm models' known sizes
    (``sizes``, None: not known yet) do not fit ``budget_mb`` together."""
    known = {name: size for name, size in sizes.items() if size is not None}
    if sum(known.values()) > budget_mb:
        shown = ", ".join(f"{name}={size}" for name, size in known.items())
        raise ConfigError("GPULANES_WARM_MODELS", f"the warm models need "
                          f"{sum(known.values())} MB ({shown}), more than this worker's "
                          f"budget of {budget_mb} MB ({budget_from}); warm fewer models")
