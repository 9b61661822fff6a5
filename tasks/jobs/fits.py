"""Whether a model can run on any worker: its size against the largest budget.

A model's size is what its class declares (``memory_mb``), else what workers measured
when they loaded it (the snapshot's ``model_mb``); budgets are the live workers' (the
snapshot), else, with no fresh snapshot, ``GPULANES_MODEL_MEMORY_MB`` unless
``GPULANES_DEVICE=cuda`` (a GPU's free memory is not known here: no check).
"""
from __future__ import annotations

from routing.policy import PolicyView
from tasks.errors import ModelError
from tasks.jobs import catalog
from tasks.settings import settings


def largest_budget(view: PolicyView | None) -> tuple[int | None, str]:
    """The largest budget in MB a job may meet, and where it was learned."""
    if view is not None and view.largest_budget_mb is not None:
        return view.largest_budget_mb, "the largest live worker's budget"
    if settings.device == "cuda":
        return None, ""
    return settings.model_memory_mb, "GPULANES_MODEL_MEMORY_MB, no live worker known"


def check_fits(model: str, view: PolicyView | None) -> None:
    """``ModelError`` naming ``model``, its size and the largest budget when it is
    larger than every worker's budget: nothing could ever run it."""
    size = catalog.spec(model).memory_mb
    if size is None and view is not None:
        size = view.model_mb.get(model)
    budget, learned = largest_budget(view)
    if size is not None and budget is not None and size > budget:
        raise ModelError(f"model {model!r} needs {size} MB, more than any worker holds: "
                         f"the largest budget is {budget} MB ({learned}); run it on larger "
                         "devices or raise GPULANES_MODEL_MEMORY_MB")
