"""Typed readers of TOML values for the config parsers (:mod:`raftsched.node.config.config`,
:mod:`raftsched.node.config.confignodes`, :mod:`raftsched.node.config.notifyconfig`): each checks
one value's type and range and raises ConfigError naming its full key
(``nodes[1].workers``), so no parser repeats those checks or their messages.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from raftsched.core.durations import parse_duration
from raftsched.core.errors import ConfigError, InvalidSpec

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", tuple: "an array", dict: "a table"}


def tname(v: Any) -> str:
    return _TYPE_NAMES.get(type(v), type(v).__name__)


def section(tbl: Any, path: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(tbl := {} if tbl is None else tbl, Mapping):
        raise ConfigError(path or "(root)", f"must be a table, got {tname(tbl)}")
    for k in tbl:
        if k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            hint_s = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{path}.{k}" if path else str(k), f"unknown key{hint_s}")
    return tbl


def read_int(tbl: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    v = tbl.get(key, default)
    # bool is an int subclass, but `workers = true` is a mistake, never a count.
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(path, f"must be an integer, got {tname(v)}")
    if not lo <= v <= hi:
        raise ConfigError(path, f"must be between {lo} and {hi}, got {v}")
    return v


def read_str(tbl: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    # default None means the key is required.
    if key not in tbl and default is None:
        raise ConfigError(path, "required key is missing")
    if not isinstance(v := tbl.get(key, default), str):
        raise ConfigError(path, f"must be a string, got {tname(v)}")
    return v


def read_strs(tbl: Mapping[str, Any], key: str, path: str, pat: re.Pattern[str],
               what: str) -> tuple[str, ...]:
    v = tbl.get(key, ())
    if not isinstance(v, (list, tuple)):
        raise ConfigError(path, f"must be an array of strings, got {tname(v)}")
    for i, item in enumerate(v):
        if not isinstance(item, str) or not pat.fullmatch(item):
            raise ConfigError(f"{path}[{i}]", f"{item!r} is not {what}")
        if item in v[:i]:
            raise ConfigError(f"{path}[{i}]", f"{item!r} is listed twice")
    return tuple(v)


def read_duration(tbl: Mapping[str, Any], key: str, path: str, default: int, lo: int,
                  hi: int) -> int:
    if key not in tbl:
        return default
    try:
        return parse_duration(tbl[key], path, minimum_ms=lo, maximum_ms=hi)
    except InvalidSpec as exc:
        raise ConfigError(path, exc.message.removeprefix(f"{exc.field}: ")) from exc


