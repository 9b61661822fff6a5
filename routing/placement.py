"""Where models should be warm: pure choices over the worker record."""
from __future__ import annotations

from typing import Mapping


def holders(workers: Mapping[str, dict], model: str) -> list[str]:
    """Healthy workers that hold ``model`` warm or are loading it."""
    return sorted(host for host, w in workers.items() if w.get("alive") and (
        model in w.get("warm_models", ()) or model in w.get("loading_models", ())))


def prewarm_targets(workers: Mapping[str, dict], model: str, replicas: int) -> list[str]:
    """Healthy workers to load ``model`` on so that ``replicas`` hold it.

    Least busy first (fewest jobs in flight, then fewest warm models), so a
    prewarm lands where it displaces the least.
    """
    missing = replicas - len(holders(workers, model))
    if missing <= 0:
        return []
    have = set(holders(workers, model))
    candidates = [(sum(w.get("in_flight", {}).values()), len(w.get("warm_models", ())), host)
                  for host, w in workers.items() if w.get("alive") and host not in have]
    return [host for *_, host in sorted(candidates)[:missing]]
