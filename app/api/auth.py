"""Bearer tokens with roles viewer < orchestrator < operator.

Without configured tokens the service only listens on loopback (checked at start-up), and every
local caller acts as an operator named `loopback`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.store.overrides import Actor

ROLE_RANK = {"viewer": 1, "orchestrator": 2, "operator": 3}
_LOOPBACK_CLIENTS = {"127.0.0.1", "::1", "localhost", "testclient"}

_bearer = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>`; tokens come from PLANNER_API_TOKENS"
)


@functools.lru_cache(maxsize=256)  # a hash per request otherwise; only configured tokens get here
def fingerprint(token: str) -> str:
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:10]


def require(min_role: str) -> Callable[..., Awaitable[Actor]]:
    # `async def`: it only looks up the token, and a plain `def` would cost a thread-pool hand-off.
    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Actor:
        tokens: dict[str, str] = request.app.state.tokens
        if not tokens:
            client = request.client.host if request.client else ""
            if client not in _LOOPBACK_CLIENTS:
                raise HTTPException(403, "no API tokens are configured, so only loopback clients are served")
            return Actor(role="operator", name="loopback")
        if credentials is None:
            raise HTTPException(
                401,
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        role = tokens.get(credentials.credentials)
        if role is None:
            raise HTTPException(401, "unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        if ROLE_RANK[role] < ROLE_RANK[min_role]:
            raise HTTPException(403, f"this endpoint needs the {min_role} role; the token has {role}")
        return Actor(role=role, name=fingerprint(credentials.credentials))

    return dependency


Viewer = Annotated[Actor, Depends(require("viewer"))]
Orchestrator = Annotated[Actor, Depends(require("orchestrator"))]
Operator = Annotated[Actor, Depends(require("operator"))]
