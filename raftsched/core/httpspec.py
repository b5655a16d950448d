"""The ``http`` executor of a job spec: a request the node makes instead of a process.

``http = { url = "...", method = "POST", headers = {...}, body = "...", timeout = "30s",
expect = [200, 204], ca = "/etc/ssl/our-ca.pem" }`` in a spec, instead of ``command``
or ``call``. Pure: validation and the spec's dict form; the request itself is made by
the node (``raftsched/node/worker/httpjob.py``).

Secrets: header values and the body are shown by ``job get`` as written. A value that
must stay secret goes into the job's ``env`` (masked everywhere) and is named as
``${NAME}`` in a header value or the body: the node fills it in when it sends the
request, and nothing it logs holds the filled-in text. ``$${`` writes a literal ``${``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from raftsched.core.durations import format_duration, parse_duration
from raftsched.core.errors import InvalidSpec, unknown_hint
from raftsched.core.notifydata import MAX_URL, check_url

#: The methods a job may use (CONNECT and TRACE are for proxies and debugging).
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: Headers the node sets itself on every request; a spec may not set any ``Raftsched-*``.
RESERVED_PREFIX = "raftsched-"
#: Headers the HTTP client computes from the body; set by hand they would lie about it.
COMPUTED = frozenset({"content-length", "transfer-encoding", "connection"})
MAX_HEADERS = 64
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096
#: A body is part of the spec, replicated and kept: the spec's own limit applies too.
MAX_BODY = 32 * 1024
MAX_CA_PATH = 1024
#: A request's own timeout never exceeds the longest job timeout.
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
_KEYS = frozenset({"url", "method", "headers", "body", "timeout", "expect", "ca"})
#: RFC 9110 token characters: what a header name is made of.
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\Z")
#: ``${NAME}`` (an env value), or ``$${`` (a literal ``${``).
REF_RE = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]{0,127})\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSpec:
    """What the node requests for each run of an HTTP job.

    :var url: an ``http://`` or ``https://`` URL with a host (no ``${}`` expansion).
    :var method: one of :data:`METHODS`; default ``POST`` with a body, else ``GET``.
    :var headers: ``(name, value)`` pairs as written (values may name ``${ENV}``).
    :var body: the request body (may name ``${ENV}``), or None for none.
    :var timeout_ms: the request's own timeout, or None: the job's ``timeout`` alone.
    :var expect: the statuses that count as success, or None: any 2xx.
    :var ca: a CA bundle (PEM) to verify the server with instead of the system's; TLS
        is always verified.
    """

    url: str
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: str | None = None
    timeout_ms: int | None = None
    expect: tuple[int, ...] | None = None
    ca: str | None = None

    @classmethod
    def from_spec(cls, value: object, env: dict[str, str], field: str = "http") -> HttpSpec:
        """Validate the ``http`` table of a spec whose ``env`` is ``env``; every error
        names its field (``http.headers.Authorization``)."""
        if not isinstance(value, dict):
            raise InvalidSpec(field, 'must be a table/map like { url = "https://..." }')
        unknown = sorted(str(k) for k in value if k not in _KEYS)
        if unknown:
            raise InvalidSpec(f"{field}.{unknown[0][:64]}",
                              unknown_hint("unknown field", unknown[0], _KEYS))
        if "url" not in value:
            raise InvalidSpec(f"{field}.url", "is required")
        url = value["url"]
        check_url(url, f"{field}.url")
        body = value.get("body")
        if body is not None:
            if not isinstance(body, str) or len(body) > MAX_BODY or not _text_ok(body):
                raise InvalidSpec(f"{field}.body", f"must be a string of at most {MAX_BODY} "
                                                   "chars")
            _check_refs(body, env, f"{field}.body")
        method = value.get("method", "GET" if body is None else "POST")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise InvalidSpec(f"{field}.method", f"must be one of {' | '.join(METHODS)}")
        method = method.upper()
        if body is not None and method in ("GET", "HEAD"):
            raise InvalidSpec(f"{field}.body", f"a {method} request carries no body; set "
                                               f"{field}.method (POST, PUT ...)")
        timeout = None
        if value.get("timeout") is not None:
            timeout = parse_duration(value["timeout"], f"{field}.timeout", minimum_ms=1000,
                                     maximum_ms=MAX_TIMEOUT_MS)
        ca = value.get("ca")
        if ca is not None and (not isinstance(ca, str) or not 0 < len(ca) <= MAX_CA_PATH
                               or "\x00" in ca or not _text_ok(ca)):
            raise InvalidSpec(f"{field}.ca", "must be the path of a CA bundle (PEM)")
        return cls(url=url, method=method, headers=_headers(value.get("headers"), env, field),
                   body=body, timeout_ms=timeout, expect=_expect(value.get("expect"), field),
                   ca=ca)

    def to_spec(self) -> dict[str, Any]:
        """The normalized map; optional parts only when set (so it reads back equal)."""
        out: dict[str, Any] = {"url": self.url, "method": self.method,
                               "headers": dict(self.headers)}
        if self.body is not None:
            out["body"] = self.body
        if self.timeout_ms is not None:
            out["timeout"] = format_duration(self.timeout_ms)
        if self.expect is not None:
            out["expect"] = list(self.expect)
        if self.ca is not None:
            out["ca"] = self.ca
        return out

    def succeeded(self, status: int) -> bool:
        """Does a response with ``status`` count as the run's success?"""
        return status in self.expect if self.expect is not None else 200 <= status < 300


def expand(text: str, env: dict[str, str]) -> str:
    """``text`` with each ``${NAME}`` replaced by ``env[NAME]`` (validation made sure
    it is there) and each ``$${`` by ``${``."""
    return REF_RE.sub(lambda m: "${" + m.group(2) + "}" if m.group(1)
                      else env.get(m.group(2), ""), text)


def _check_refs(text: str, env: dict[str, str], field: str) -> None:
    for m in REF_RE.finditer(text):
        if not m.group(1) and m.group(2) not in env:
            raise InvalidSpec(field, f"names ${{{m.group(2)}}}, which is not in env (a "
                                     "secret goes into env and is named here; $${ writes "
                                     "a literal ${)")


def _headers(value: object, env: dict[str, str], field: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_HEADERS:
        raise InvalidSpec(f"{field}.headers", f"must be a map of at most {MAX_HEADERS} "
                                              "header names to strings")
    seen: set[str] = set()
    out = []
    for name in value:
        if not isinstance(name, str) or not _TOKEN_RE.match(name):
            raise InvalidSpec(f"{field}.headers", f"{str(name)[:64]!r} is not a header name "
                                                  "(letters, digits and !#$%&'*+.^_`|~-)")
        where = f"{field}.headers.{name}"
        low = name.lower()
        if low.startswith(RESERVED_PREFIX):
            raise InvalidSpec(where, "Raftsched-* headers are set by the node (run id, "
                                     "fence, attempt, fire time)")
        if low in COMPUTED:
            raise InvalidSpec(where, "is computed by the HTTP client; do not set it")
        if low in seen:
            raise InvalidSpec(where, "is given twice (header names ignore case)")
        seen.add(low)
        val = value[name]
        # The value itself never goes into an error: it may be a credential.
        if not isinstance(val, str) or len(val) > MAX_HEADER_VALUE or not _text_ok(val) \
                or any(c in val for c in "\r\n\x00"):
            raise InvalidSpec(where, f"must be a one-line string of at most "
                                     f"{MAX_HEADER_VALUE} chars")
        _check_refs(val, env, where)
        out.append((name, val))
    return tuple(out)


def _expect(value: object, field: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not 0 < len(value) <= 100:
        raise InvalidSpec(f"{field}.expect", "must be a list of 1..100 HTTP statuses")
    for i, status in enumerate(value):
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise InvalidSpec(f"{field}.expect[{i}]", "must be an HTTP status, an integer "
                                                      "in 100..599")
    return tuple(sorted(set(value)))


def _text_ok(text: str) -> bool:
    """False for text msgpack cannot carry (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = ["COMPUTED", "MAX_BODY", "MAX_URL", "METHODS", "RESERVED_PREFIX", "HttpSpec",
           "expand"]
