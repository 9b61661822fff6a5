"""``GET /v1/webhooks/default/secret``: the secret the caller's webhooks are signed with
(``tasks.jobs.webhooks.secret``), to check each delivery's ``webhook-signature`` with a
Standard Webhooks library."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from tasks.broker.app import redis_client
from tasks.front.auth import caller
from tasks.jobs import webhooks
from tasks.jobs.apikeys import ApiKey

router = APIRouter(prefix="/v1", tags=["webhooks"])


@router.get("/webhooks/default/secret")
def webhook_secret(key: ApiKey = Depends(caller)) -> dict[str, str]:
    """The signing secret of the caller's account (``whsec_...``), made on first use."""
    return {"key": webhooks.secret(redis_client(), key.account)}
