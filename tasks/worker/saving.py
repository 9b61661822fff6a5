"""Writing a finished run's artifacts, waiting out a store that refuses them.

The model's work is the expensive part: once it is done, its output is not thrown
away because the store is full, read-only or away for a while. The run keeps the
encoded bytes in memory and tries the write again, the pause doubling from
``FIRST_PROBE_S`` up to :data:`RETRY_CAP_S`, for as long as a run may hold its
job (``run_hung_s`` from its start, less a margin): its caller sees it still
running, and its lease stays extended meanwhile (``gpu_worker.hooks.KeepLeases``). At
the first refusal the worker steps aside (``gpu_worker.health``), so it runs no other
model for an output it could not store; it serves again once its self-check finds
room for what its runs wrote. Before each try the run checks its lease: a run taken
over meanwhile writes nothing. Only a store that refuses for the whole wait fails
the run, as the worker's fault (:class:`~tasks.errors.ArtifactError`): the job then
goes back to its lane and its model runs again, elsewhere.
"""
from __future__ import annotations

import logging
import time

from gpu_worker.faults import ARTIFACT_BYTES
from gpu_worker.health import FIRST_PROBE_S, HEALTH, probe_delays_s
from gpu_worker.lease import Lease
from tasks.errors import ArtifactError, WorkerStopping
from tasks.broker.outage import stopping
from tasks.jobs.artifacts import ArtifactRef, store_bytes
from tasks.settings import settings
from tasks.worker.outputs import Blob

log = logging.getLogger(__name__)
#: Longest pause between two tries of a refused write.
RETRY_CAP_S = 5.0


def write_all(job_id: str, lease: Lease, blobs: list[Blob],
              started_at: float) -> dict[str, ArtifactRef]:
    """Write ``blobs`` as the artifacts of ``lease``'s run of ``job_id`` (which began at
    unix time ``started_at``): their references by name. See the module's docstring."""
    ARTIFACT_BYTES.ran(sum(len(blob.data) for blob in blobs))
    deadline_s = started_at + settings.run_hung_s - 2 * settings.lease_ttl_s
    refs: dict[str, ArtifactRef] = {}
    for i, blob in enumerate(blobs):
        lease.check()  # a stale run writes no artifact
        try:
            refs[blob.name] = _write(job_id, lease.attempt, blob)
        except ArtifactError as exc:
            with ARTIFACT_BYTES.waiting(sum(len(left.data) for left in blobs[i:])):
                refs[blob.name] = _wait_for_store(job_id, lease, blob, exc, deadline_s)
    return refs


def _write(job_id: str, run: int, blob: Blob) -> ArtifactRef:
    return store_bytes(job_id, run, blob.name, blob.data, blob.media_type)


def _wait_for_store(job_id: str, lease: Lease, blob: Blob, refused: ArtifactError,
                    deadline_s: float) -> ArtifactRef:
    """Try ``blob`` again until the store takes it; past ``deadline_s`` (unix), raise the
    last refusal."""
    HEALTH.store_refused(refused)
    log.warning("job %s: the artifact store refused its output (%s); the run keeps it and "
                "tries again for up to %.0fs", job_id, refused, deadline_s - time.time())
    pauses_s = probe_delays_s(FIRST_PROBE_S, RETRY_CAP_S)
    while True:
        pause_s = next(pauses_s)
        if time.time() + pause_s > deadline_s:
            log.error("job %s: the artifact store refused its output until the end of the "
                      "wait: the job goes back to its lane", job_id)
            raise refused
        time.sleep(pause_s)  # the lease is extended meanwhile (KeepLeases)
        if stopping():  # the worker is told to stop: the job goes back to its lane
            raise WorkerStopping(f"the artifact store refused the output of job {job_id} "
                                 "and this worker is stopping") from refused
        lease.check()
        try:
            ref = _write(job_id, lease.attempt, blob)
        except ArtifactError as exc:
            refused = exc
            continue
        log.warning("job %s: the artifact store took its output after all", job_id)
        HEALTH.store_took()
        return ref
