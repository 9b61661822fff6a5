"""The models a job may name (``GPULANES_MODELS``) and the inputs each takes.

A model is a class (``name=module:Class``) with an ``Input`` (a pydantic model: the
job's parameters) and ``predict(inputs, progress) -> dict``; the submitting process
imports its module for ``Input`` only (weights load in the worker). A factory
(``name=module:function``, the built-in demo family among them) makes an image
model, whose inputs are ``prompt``, ``seed``, ``steps``, ``width`` and ``height``
(``tasks.jobs.schema``); a factory in ``gpu_worker`` is never imported here: the
worker's code stays out of a submitting process.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tasks.broker.message import BOOKKEEPING, ROUTING
from tasks.errors import ModelError
from tasks.settings import settings

#: A model class's optional hooks of its inputs alone, called on the class itself.
CLASS_HOOKS: tuple[str, ...] = ("cost", "route_key", "batch_key")
#: Modules of worker-side factories: known to make image models, never imported here.
WORKER_PACKAGE = "gpu_worker."


@dataclass(frozen=True)
class ModelSpec:
    """One entry of ``GPULANES_MODELS``, resolved: a class model or an image factory."""

    name: str
    target: str
    cls: type | None = None  #: the model's class; None: an image model's factory

    @property
    def Input(self) -> Any:  # noqa: N802  the contract's name
        return self.cls.Input if self.cls else None

    @property
    def deterministic(self) -> bool:
        """Same validated inputs, same output: its results may be cached and shared."""
        return bool(getattr(self.cls, "deterministic", False))

    @property
    def memory_mb(self) -> int | None:
        """What the model declares it holds loaded, in MB (None: measured at its load)."""
        return declared_mb(self.cls, self.name)

    @property
    def version(self) -> str:
        """The model's pinned version: part of its cache key (a new one serves nothing old)."""
        return str(getattr(self.cls, "version", ""))


def declared_mb(target: Any, name: str = "") -> int | None:
    """The size in MB ``target`` (a model class, factory or object) declares in its
    ``memory_mb``, or None; ``ModelError`` naming the model unless a positive int."""
    size = getattr(target, "memory_mb", None)
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"model {name!r}: memory_mb must be a positive int (MB) or None, "
                         f"got {size!r}")
    return size


def spec(name: str) -> ModelSpec:
    """The model ``name`` names (``ModelError`` if its class cannot be imported)."""
    return _resolve(name, settings.models[name])


@lru_cache(maxsize=256)
def _resolve(name: str, target: str) -> ModelSpec:
    module_name, _, attr = target.partition(":")
    if module_name.startswith(WORKER_PACKAGE):
        return ModelSpec(name, target)
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"model {name!r}: cannot import {target!r} "
                         f"(GPULANES_MODELS): {type(exc).__name__}: {exc}") from exc
    if not (isinstance(found, type) and hasattr(found, "predict")):
        return ModelSpec(name, target)  # a factory: an image model
    _check_class(name, target, found)
    return ModelSpec(name, target, found)


def _check_class(name: str, target: str, cls: type) -> None:
    fields = getattr(getattr(cls, "Input", None), "model_fields", None)
    if fields is None:
        raise ModelError(f"model {name!r} ({target}): its class has no pydantic Input")
    if clash := sorted(set(fields) & {*ROUTING, *BOOKKEEPING}):
        raise ModelError(f"model {name!r} ({target}): input {clash[0]!r} is a name "
                         f"submit() reserves ({', '.join((*ROUTING, *BOOKKEEPING))}); rename it")
    for hook in CLASS_HOOKS:  # called on the class, in processes that hold no weights
        found = inspect.getattr_static(cls, hook, None)
        if found is not None and not isinstance(found, (staticmethod, classmethod)):
            raise ModelError(f"model {name!r} ({target}): {hook}(inputs) must be a "
                             "@staticmethod or @classmethod: it is called on the class, "
                             "where no weights are loaded")
