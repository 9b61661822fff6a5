"""Input field types a model may use for its ``Input``."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from tasks.jobs.artifacts import in_store

#: The URL of an artifact in gpulanes' artifact store (an earlier job's image, say):
#: the only files a job may name for its model to read (``tasks.jobs.artifacts.in_store``).
StoredArtifact = Annotated[str, AfterValidator(in_store)]
