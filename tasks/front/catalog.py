"""``GET /v1/models``: each model a prediction may name (``GPULANES_MODELS``) and the JSON
schema of its input: a class model's ``Input``, an image model's fixed inputs
(``tasks.jobs.image.ImageInput``)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import PydanticUserError

from tasks.errors import ModelError
from tasks.front.auth import caller
from tasks.jobs import catalog
from tasks.jobs.image import ImageInput
from tasks.jobs.schema import model_names
from tasks.settings import settings

router = APIRouter(prefix="/v1", tags=["models"])


def described(name: str) -> dict[str, Any]:
    """One model: its name, kind (``image`` or ``class``), version, whether its results
    may be shared, and its input's JSON schema (None when its class cannot be imported:
    a prediction of it is refused as such)."""
    try:
        found = catalog.spec(name)
    except ModelError:
        return {"name": name, "kind": None, "available": False, "input_schema": None}
    try:
        schema = (found.Input if found.cls else ImageInput).model_json_schema()
    except PydanticUserError:  # a type JSON Schema cannot say (the model still runs)
        schema = None
    return {"name": name, "kind": "class" if found.cls else "image", "available": True,
            "version": found.version or None, "deterministic": found.deterministic,
            "input_schema": schema}


@lru_cache(maxsize=4)
def _listed(models: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    return [described(name) for name in model_names()]


@router.get("/models", dependencies=[Depends(caller)])
def models() -> dict[str, Any]:
    """Every model, by name, with its input's JSON schema."""
    return {"results": _listed(tuple(sorted(settings.models.items())))}
