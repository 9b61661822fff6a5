"""``/v1/predictions``: create one, read it, cancel it, list them, fetch its files. A
caller sees only its own account's predictions: any other id is a 404, as an unknown
one is. Every call that blocks on Redis runs in a thread, never on the event loop."""
from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

from celery.states import READY_STATES
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from tasks.api import submit_placed
from tasks.broker.cells import of_job, result
from tasks.broker.outage import OUTAGE
from tasks.front import create, paging
from tasks.front.auth import SECURITY, caller, request_key
from tasks.front.errors import Refused
from tasks.front.files import artifacts, served
from tasks.front.views import FINAL, Seen, prediction_json, seen, status
from tasks.jobs import events, predictions
from tasks.jobs.apikeys import ApiKey
from tasks.jobs.plans import plan
from tasks.jobs.predictions import Prediction

router = APIRouter(prefix="/v1", tags=["predictions"])
#: Seconds between two looks at a result while ``Prefer: wait`` waits, from the first
#: to the longest: a quick job is answered quickly, a slow one costs few reads.
FIRST_LOOK_S, LONGEST_LOOK_S = 0.02, 0.25
NOT_FOUND = "no such prediction (or not one of this API key's account)"


def base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def owned(account: str, prediction_id: str) -> Prediction:
    """The caller's prediction ``prediction_id`` (read in the cell its id names), or 404."""
    found = predictions.owned(of_job(prediction_id)[1], account, prediction_id)
    if found is None:
        raise Refused(404, NOT_FOUND)
    return found


def shown(prediction: Prediction, request: Request, placed: bool = True) -> dict[str, Any]:
    """The prediction as JSON, read now (blocks on Redis)."""
    return prediction_json(prediction, seen(*of_job(prediction.id), prediction, placed),
                           base_url(request))


@router.post("/predictions", status_code=201,
             openapi_extra={**create.OPENAPI, "security": SECURITY})
async def create_prediction(request: Request) -> dict[str, Any]:
    """Submit a prediction; 201 with it as it stands (``Prefer: wait=N``: once done,
    or after N s)."""
    asked = request.headers
    # the body is parsed before the key is checked (a body that is not JSON is a 422
    # even without one), and checked after it, in FastAPI's order
    found = await create.body_json(request)
    key = await request_key(request)
    body = create.request_body(found)
    same = create.idempotency_key(asked.get("idempotency-key"))
    after_s = create.cancel_after(asked.get("cancel-after"))
    call = partial(submit_placed, tier=body.tier, account=key.account, model=body.model,
                   downgradable=body.downgradable, plan=plan(key.plan), idempotency_key=same,
                   cancel_after=after_s, webhook=body.webhook,
                   webhook_events_filter=body.webhook_events_filter,
                   api_url=base_url(request), **body.inputs())
    wait_s = create.wait_s(asked.get("prefer"))
    where, made = await run_in_threadpool(call)
    if made is not None and not wait_s:  # just queued, as recorded: nothing to read
        view = prediction_json(made, Seen("PENDING", position=where.position),
                               base_url(request))
    else:  # an idempotency key's earlier prediction, or one waited for
        if wait_s:
            await settled(where.job_id, wait_s)
        view = await run_in_threadpool(
            lambda: shown(_made(key.account, where.job_id, body, after_s), request))
    # sent as it is: the view is plain JSON already (no encoder pass over it)
    headers = {"Location": view["urls"]["get"]}
    if wait_s:
        headers["Preference-Applied"] = f"wait={wait_s:g}"
    return JSONResponse(view, status_code=201, headers=headers)


def _sent(account: str, job_id: str, body: create.PredictionRequest,
          cancel_after_s: float | None) -> Prediction:
    """The prediction as this request made it (what its record says, unread)."""
    now = time.time()
    return Prediction(id=job_id, account=account, model=body.model, tier=body.tier,
                      input=body.input, created_at=now,
                      cancel_after_at=None if cancel_after_s is None else now + cancel_after_s)


def _made(account: str, job_id: str, body: create.PredictionRequest,
          cancel_after_s: float | None) -> Prediction:
    """The prediction as recorded (the first one, for a repeated idempotency key); as
    asked, should its record not be there to read."""
    return predictions.owned(of_job(job_id)[1], account, job_id) or _sent(
        account, job_id, body, cancel_after_s)


async def settled(job_id: str, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for the job to end; whether it did. Redis away ends the
    wait: the prediction was made, and is answered as it stands."""
    deadline, look_s = time.monotonic() + wait_s, FIRST_LOOK_S
    while True:
        try:
            state = await run_in_threadpool(lambda: result(job_id).state)
        except OUTAGE:
            return False
        left_s = deadline - time.monotonic()
        if state in READY_STATES or left_s <= 0:
            return state in READY_STATES
        await asyncio.sleep(min(look_s, left_s))
        look_s = min(look_s * 2, LONGEST_LOOK_S)


@router.get("/predictions/{prediction_id}")
def get_prediction(prediction_id: str, request: Request,
                   key: ApiKey = Depends(caller)) -> dict[str, Any]:
    """The prediction now: its status, queue place or progress, output or error."""
    return shown(owned(key.account, prediction_id), request)


@router.post("/predictions/{prediction_id}/cancel")
def cancel_prediction(prediction_id: str, request: Request,
                      key: ApiKey = Depends(caller)) -> dict[str, Any]:
    """Cancel it: queued, it never runs; running, it stops at its next step. One that
    has ended is left as it is."""
    prediction = owned(key.account, prediction_id)
    celery_app, client = of_job(prediction.id)
    if status(prediction, seen(celery_app, client, prediction, False)) not in FINAL:
        celery_app.AsyncResult(prediction.id).revoke()
        # its event log ends now if its job never began (a run logs its own end)
        events.end(client, prediction.id, "REVOKED", unless_began=True)
    return shown(prediction, request)


@router.get("/predictions")
def list_predictions(request: Request, key: ApiKey = Depends(caller),
                     cursor: str | None = Query(None, description="`next` of a page"),
                     limit: int = Query(paging.DEFAULT_LIMIT, ge=1, le=paging.MAX_LIMIT)
                     ) -> dict[str, Any]:
    """The caller's predictions, newest first, a page at a time (``next``: the
    following page's URL, None after the last)."""
    page, after = paging.page(key.account, cursor, limit)
    following = None if after is None else \
        f"{base_url(request)}/v1/predictions?cursor={after}&limit={limit}"
    return {"results": [shown(p, request, placed=False) for p in page], "next": following}


@router.get("/predictions/{prediction_id}/files/{name}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}},
                             "description": "The file, as its media type says."}})
def get_file(prediction_id: str, name: str, key: ApiKey = Depends(caller)) -> Response:
    """A file the prediction's output names (its URL there), to its account only."""
    prediction = owned(key.account, prediction_id)
    found = seen(*of_job(prediction.id), prediction, placed=False)
    made = artifacts(found.value) if found.state == "SUCCESS" and \
        isinstance(found.value, dict) else {}
    if name not in made:
        raise Refused(404, f"prediction {prediction_id} has no file {name[:80]!r}")
    return served(made[name])
