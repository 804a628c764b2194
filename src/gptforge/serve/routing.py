"""How a request reaches its route, and what one that reaches none is told: a trailing slash routed as the path
without it, a 405's ``Allow`` in a fixed order (HEAD beside GET), an OPTIONS request (a browser's CORS preflight)
told that this server answers no CORS, and a 404 told the route it was most likely meant as.

    app.add_middleware(TrailingSlash)
    message, headers = route_miss(request, exc, app.routes)   # the 404/405 text and the Allow header
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute

# What an OPTIONS request (a browser's CORS preflight) is told. No CORS by design: only the server's own page calls it
# from a browser, so no other web page a user visits can use a server on their machine (or its key)
NO_CORS = ("OPTIONS is a browser's CORS preflight, which this server does not answer, by design: it sends no "
           "Access-Control-Allow-* headers, so a page from another origin cannot call it (use the page it serves at /, "
           "or call it from a program)")
_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(allow: str) -> str:
    """A 405's ``Allow`` as the app answers it: the route's methods with HEAD beside GET (BodyRoute and Starlette's
    own routes answer HEAD for every GET), in a fixed order (Starlette joins a set, whose order varies)."""
    methods = {m.strip().upper() for m in allow.split(",") if m.strip()}
    if "GET" in methods:
        methods.add("HEAD")
    order = {m: i for i, m in enumerate(_METHOD_ORDER)}
    return ", ".join(sorted(methods, key=lambda m: (order.get(m, len(order)), m)))


class TrailingSlash:
    """Pure ASGI middleware: a path with a trailing slash is routed as the path without it (``POST
    /v1/chat/completions/`` is the chat route). Starlette answered it with an empty 307 redirect, which curl without
    ``-L`` and many clients do not follow for a POST, and whose absolute ``Location`` behind a TLS proxy names
    ``http://`` (a client that follows it drops the Authorization header on the scheme change). Routing it
    directly needs nothing of the client."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (bare := path.rstrip("/")) and bare != path:  # "//" is no route's path
            scope = {**scope, "path": bare}
        await self.app(scope, receive, send)


def near_route(path: str, routes: Any) -> str | None:
    """The route (of ``routes``, an app's) an unknown path was most likely meant as: the same path under a prefix,
    or with one missing (``/chat/completions`` from an OpenAI client whose base_url lacks ``/v1``;
    ``/v1/v1/models``), compared without case and a trailing slash."""
    want = path.lower().rstrip("/")
    if len(want) < 2:
        return None
    for route in routes:
        known = getattr(route, "path", "")
        if isinstance(route, APIRoute) and (known.endswith(want) or want.endswith(known)):
            return known
    return None


def route_miss(method: str, path: str, status: int, detail: str, headers: dict[str, str],
               routes: Any) -> tuple[str, str | None]:
    """The framework's 404 (no route at ``path``) or 405 (no ``method`` at it) told in words: the method and path,
    the methods allowed, the route it was most likely meant as, the CORS answer to an OPTIONS, and where the routes
    are listed; and the route it was meant as (None: none). ``headers``: the exception's, whose ``Allow`` is
    rewritten in place as :func:`allowed_methods` answers it."""
    allowed = allowed_methods(headers.pop("Allow", ""))
    if allowed:
        headers["Allow"] = allowed
    near = near_route(path, routes) if status == 404 else None
    message = (f"{detail}: {method} {path}" + (f" (allowed: {allowed})" if allowed else "")
               + (f"; did you mean {near}?" if near else "")
               + (" (an OpenAI client's base_url ends in /v1)" if near and near.startswith("/v1") else "")
               + (f"; {NO_CORS}" if status == 405 and method == "OPTIONS" else "")
               + "; the routes are listed at /docs")
    return message, near
