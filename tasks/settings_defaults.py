"""The constants behind gpulanes' settings: the variables' prefix, the built-in models,
each lane's default budgets, and the fixed values no variable sets (a retry's backoff, a
sick worker's count of failures). ``tasks.settings`` exports them all."""
from __future__ import annotations

from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
PREFIX = "GPULANES_"
#: The built-in family: ``demo`` and ``demo-0`` ... ``demo-15``, one architecture with
#: different deterministic weights, so multi-model serving can be tried here.
DEMO_TARGET = "gpu_worker.demo_model:load"
DEMO_MODELS = {name: DEMO_TARGET for name in ["demo", *(f"demo-{i}" for i in range(16))]}
#: What each of them declares it holds, in MB (its weights are about 1.1 MB).
DEMO_MODEL_MB = 2
#: The models known without GPULANES_MODELS: the demo family, ``echo`` and ``faces``.
BUILT_IN_MODELS = {**DEMO_MODELS, "echo": "tasks.models.echo:Echo",
                   "faces": "tasks.models.faces:Faces"}

#: Each lane's wait budget (GPULANES_MAX_WAIT_S): relaxed has none, it takes what is left.
MAX_WAIT_DEFAULT_S = {"fast": 10.0, "standard": 60.0}
#: Each lane's most queued jobs (GPULANES_MAX_DEPTH).
MAX_DEPTH_DEFAULT = {"fast": 500, "standard": 2000, "relaxed": 10000}
#: A retry's backoff: uniform in [0, min(RETRY_CAP_S, RETRY_BASE_S x 2^(try - 1))].
RETRY_BASE_S = 0.5
RETRY_CAP_S = 30.0
#: Failures of a worker's own making in a row (disk, device, local files) after which
#: it stops taking jobs until a self-check passes again.
SICK_AFTER = 3
