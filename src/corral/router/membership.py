"""The set of endpoints the router may send to, and the per-model index it routes from.

Sources (the static list today; Kubernetes and supervisor state streams later) change it only
through `add`, `update` and `remove`; the data path only reads it through `eligible`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from corral.router.endpoint import Endpoint, EngineState

log = logging.getLogger("corral.router.membership")


class Membership:
    def __init__(self) -> None:
        self._endpoints: dict[str, Endpoint] = {}
        # model -> endpoints that serve it, in any state; rebuilt on every change so that
        # the hot path is one dict lookup and a short filter.
        self._serving: dict[str, tuple[Endpoint, ...]] = {}

    # -- changes (from sources) -------------------------------------------------------------

    def add(self, endpoint: Endpoint, reason: str) -> Endpoint:
        existing = self._endpoints.get(endpoint.url)
        if existing is not None:
            return existing
        self._endpoints[endpoint.url] = endpoint
        log.info("endpoint %s added (%s): %s", endpoint.url, endpoint.state, reason)
        self._reindex()
        return endpoint

    def update(
        self,
        url: str,
        reason: str,
        *,
        state: EngineState | None = None,
        models: frozenset[str] | None = None,
        model_cards: tuple[dict[str, Any], ...] | None = None,
    ) -> Endpoint | None:
        """Change an endpoint's state and/or what it serves; unknown urls are ignored."""
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            return None
        before = endpoint.state
        target = before if state is None else state
        if endpoint.set_state(target, reason) and before is not target:
            log.info("endpoint %s %s -> %s: %s", url, before, target, reason)
        if model_cards is not None:
            endpoint.model_cards = model_cards
        if models is not None and models != endpoint.models:
            log.info("endpoint %s serves %s", url, sorted(models))
            endpoint.models = models
            self._reindex()
        return endpoint

    def remove(self, url: str, reason: str) -> Endpoint | None:
        """Forget an endpoint; requests already in flight to it finish on their own."""
        endpoint = self._endpoints.pop(url, None)
        if endpoint is not None:
            log.info("endpoint %s removed: %s", url, reason)
            self._reindex()
        return endpoint

    def _reindex(self) -> None:
        serving: dict[str, list[Endpoint]] = {}
        for endpoint in self._endpoints.values():
            for model in endpoint.models:
                serving.setdefault(model, []).append(endpoint)
        self._serving = {model: tuple(eps) for model, eps in serving.items()}

    # -- reads ------------------------------------------------------------------------------

    def get(self, url: str) -> Endpoint | None:
        return self._endpoints.get(url)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints.values())

    def eligible(self, model: str, now: float | None = None) -> list[Endpoint]:
        """Endpoints that may take a request for `model` now: READY, serving it, not ejected."""
        if now is None:
            now = time.monotonic()
        ready = EngineState.READY
        return [e for e in self._serving.get(model, ()) if e.state is ready and e.ejected_until <= now]

    def knows(self, model: str) -> bool:
        """Whether any endpoint, in any state, has said it serves `model`."""
        return model in self._serving

    def known_models(self) -> list[str]:
        return list(self._serving)

    def ready_count(self) -> int:
        return sum(1 for e in self._endpoints.values() if e.state is EngineState.READY)

    def retry_after(self, model: str, default: float) -> int:
        """Seconds a client should wait before retrying `model`: the soonest ejection end."""
        now = time.monotonic()
        waits = [e.ejected_until - now for e in self._serving.get(model, ()) if e.is_ejected(now)]
        seconds = min(waits) if waits else default
        return max(1, int(seconds + 0.999))

    def model_cards(self) -> list[dict[str, Any]]:
        """The union of what READY endpoints serve, one card per model id (first seen wins)."""
        seen: dict[str, dict[str, Any]] = {}
        for endpoint in self._endpoints.values():
            if endpoint.state is not EngineState.READY:
                continue
            for card in endpoint.model_cards:
                model_id = card.get("id")
                if isinstance(model_id, str) and model_id not in seen:
                    seen[model_id] = card
        return list(seen.values())
