"""The OpenAPI 3.1 document of the HTTP API, written as data (served at /openapi.json).

The schemas name the fields clients rely on and their types; objects stay open
(``additionalProperties`` allowed) so the API can add fields without breaking
clients. tests/cluster/test_http_api.py validates real responses against it.
"""

from __future__ import annotations

import copy
from typing import Any

from raftsched.core.httpspec import METHODS

_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string", "examples": ["invalid_spec"]},
                           "message": {"type": "string"}}}}},
    "JobSpec": {
        "type": "object",
        "description": "A job spec as in the docs (id may come from the path): a schedule, "
                       "or after (a dependent job).",
        "anyOf": [{"required": ["schedule"]}, {"required": ["after"]}],
        "properties": {"id": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"},
                       "schedule": {"type": "object"},
                       "after": {"type": "array", "items": {"type": "string"},
                                 "description": "Run once per fire time after these jobs' "
                                                "runs for it ended (no schedule of its own)."},
                       "on": {"enum": ["success", "failure", "always"]},
                       "concurrency": {
                           "type": "object", "required": ["key", "max"],
                           "properties": {"key": {"type": "string"},
                                          "max": {"type": "integer", "minimum": 1},
                                          "policy": {"enum": ["queue", "skip"]}}},
                       "start": {"type": "string", "format": "date-time",
                                 "description": "No fire time before it (RFC 3339)."},
                       "end": {"type": "string", "format": "date-time",
                               "description": "No fire time after it (RFC 3339); after "
                                              "it the job is done."},
                       "command": {"type": "array", "items": {"type": "string"}},
                       "call": {"type": "string"},
                       "http": {"$ref": "#/components/schemas/HttpSpec"},
                       "paused": {"type": "boolean"}}},
    "HttpSpec": {
        "type": "object", "required": ["url"],
        "description": "An HTTP job's request (instead of command or call); header values "
                       "and the body may name env values as ${NAME}.",
        "properties": {"url": {"type": "string"},
                       "method": {"enum": list(METHODS)},
                       "headers": {"type": "object",
                                   "additionalProperties": {"type": "string"}},
                       "body": {"type": "string"}, "timeout": {"type": "string"},
                       "expect": {"type": "array", "items": {"type": "integer"}},
                       "ca": {"type": "string"}}},
    "Last": {
        "type": ["object", "null"],
        "properties": {"run_id": {"type": "string"}, "state": {"type": "string"},
                       "reason": {"type": "string"}, "at_ms": {"type": "integer"}}},
    "Job": {
        "type": "object",
        "required": ["id", "spec", "version", "created_ms", "updated_ms", "next_ms", "paused",
                     "active", "last"],
        "properties": {"id": {"type": "string"}, "spec": {"$ref": "#/components/schemas/JobSpec"},
                       "version": {"type": "integer"}, "created_ms": {"type": "integer"},
                       "updated_ms": {"type": "integer"}, "hwm_ms": _NULLABLE_INT,
                       "next_ms": _NULLABLE_INT, "paused": {"type": "boolean"},
                       "done": {"type": "boolean", "description": "Nothing will fire again: "
                                "a one-shot that ran, or a job past its end."},
                       "active": {"type": "array", "items": {"type": "string"}},
                       "last": {"$ref": "#/components/schemas/Last"},
                       "stale": {"type": "boolean"}}},
    "JobList": {
        "type": "object", "required": ["jobs", "total"],
        "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                       "total": {"type": "integer"}, "stale": {"type": "boolean"}}},
    "PutResult": {
        "type": "object", "required": ["job", "version", "created"],
        "properties": {"job": {"type": "string"}, "version": {"type": "integer"},
                       "created": {"type": "boolean"},
                       # Present when there are any: e.g. tags no member has.
                       "warnings": {"type": "array", "items": {"type": "string"}}}},
    "PutManyResult": {
        "type": "object", "required": ["results"],
        "properties": {"results": {"type": "array", "items": {"type": "object"}}}},
    "DryRun": {
        "type": "object", "required": ["results", "dry_run"],
        "properties": {"dry_run": {"const": True}, "results": {"type": "array", "items": {
            "type": "object", "required": ["id", "change", "fields"],
            "properties": {"id": {"type": "string"},
                           "change": {"enum": ["created", "updated", "unchanged"]},
                           "fields": {"type": "array", "items": {"type": "string"}},
                           "diff": {"type": "object"}}}}}},
    "Deleted": {"type": "object", "required": ["job", "deleted"],
                "properties": {"job": {"type": "string"}, "deleted": {"const": True}}},
    "Paused": {"type": "object", "required": ["job", "version", "paused"],
               "properties": {"job": {"type": "string"}, "version": {"type": "integer"},
                              "paused": {"type": "boolean"},
                              "skipped_fire_times": {"type": "integer"}}},
    "Triggered": {"type": "object", "required": ["run_id", "state"],
                  "properties": {"run_id": {"type": "string"}, "state": {"type": "string"}}},
    "Run": {
        "type": "object",
        "required": ["run_id", "job_id", "scheduled_ms", "state", "attempt", "fence", "node",
                     "reason", "transitions"],
        "properties": {"run_id": {"type": "string"}, "job_id": {"type": "string"},
                       "scheduled_ms": {"type": "integer"}, "state": {"type": "string"},
                       "attempt": {"type": "integer"}, "fence": {"type": "integer"},
                       "node": _NULLABLE_STR, "reason": {"type": "string"},
                       "started_ms": _NULLABLE_INT, "executed_ms": _NULLABLE_INT,
                       "finished_ms": _NULLABLE_INT,
                       "exit_code": _NULLABLE_INT, "tail": {"type": "string"},
                       "transitions": {"type": "array", "items": {"type": "object"}}}},
    "RunList": {
        "type": "object", "required": ["job", "runs"],
        "properties": {"job": {"type": "string"},
                       "runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
                       "stale": {"type": "boolean"}}},
    "RunLog": {
        "type": "object",
        "required": ["run_id", "job_id", "attempt", "attempts", "node", "state", "stream",
                     "offset", "next_offset", "size", "sizes", "text", "done"],
        "description": "A chunk of one stream of a run's full log, read from the node "
                       "that ran the attempt. Poll on with offset=next_offset until done.",
        "properties": {
            "run_id": {"type": "string"}, "job_id": {"type": "string"},
            "attempt": {"type": "integer"},
            "attempts": {"type": "array", "items": {"type": "integer"}},
            "node": {**_NULLABLE_STR, "description": "the node that ran the attempt (null: "
                                                     "never placed on one)"},
            "state": {"type": "string"}, "stream": {"enum": ["stdout", "stderr"]},
            "offset": {"type": "integer"}, "next_offset": {"type": "integer"},
            "size": {"type": "integer", "description": "the stream's bytes so far"},
            "sizes": {"type": "object", "properties": {"stdout": {"type": "integer"},
                                                       "stderr": {"type": "integer"}}},
            "text": {"type": "string"},
            "done": {"type": "boolean", "description": "the log will not grow any more"},
            "removed": {**_NULLABLE_STR, "description": "the limit that removed this log "
                                                        "from its node, if one did"}}},
    "NextFires": {
        "type": "object", "required": ["schedule", "tz", "description", "fires", "paused"],
        "properties": {
            "id": {"type": "string"}, "tz": {"type": "string"}, "schedule": {"type": "object"},
            "description": {"type": "string"}, "paused": {"type": "boolean"},
            "now_ms": {"type": "integer"}, "start": {"type": "string"},
            "end": {"type": "string"},
            "after": {"type": "array", "items": {"type": "string"},
                      "description": "A dependent job's parents (it has no fire times of "
                                     "its own; description says 'after ...')."},
            "on": {"enum": ["success", "failure", "always"]},
            "fires": {"type": "array", "items": {
                "type": "object", "required": ["at_ms", "utc", "local"],
                "properties": {"at_ms": {"type": "integer"}, "utc": {"type": "string"},
                               "local": {"type": "string"}, "weekday": {"type": "string"},
                               "dst_change": {"type": "string"}}}}}},
    "Backfill": {
        "type": "object",
        "required": ["id", "job", "from_ms", "to_ms", "fire_times", "done", "state", "active",
                     "counts", "overlap", "max", "rerun"],
        "properties": {
            "id": {"type": "string", "examples": ["bf-1"]}, "job": {"type": "string"},
            "from_ms": {"type": "integer"}, "to_ms": {"type": "integer"},
            "fire_times": {"type": "integer", "description": "Fire times in the range."},
            "done": {"type": "integer", "description": "Fire times dealt with (run to an "
                                                        "end, or counted skipped)."},
            "next_ms": _NULLABLE_INT, "overlap": {"enum": ["allow", "skip", "queue"]},
            "max": {"type": "integer"}, "rerun": {"type": "boolean"},
            "state": {"enum": ["running", "done", "cancelled"]},
            "created_ms": {"type": "integer"}, "finished_ms": _NULLABLE_INT,
            "reason": {"type": "string"},
            "active": {"type": "array", "items": {"type": "string"}},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}}}},
    "BackfillList": {
        "type": "object", "required": ["backfills"],
        "properties": {"backfills": {"type": "array", "items": {
            "$ref": "#/components/schemas/Backfill"}}}},
    "TokenRole": {"type": "object", "required": ["role", "node"],
                  "properties": {"role": {"enum": ["admin", "read"]},
                                 "node": {"type": "string"}}},
    "Status": {
        "type": "object",
        "required": ["node", "leader", "term", "health", "summary", "nodes", "jobs",
                     "active_runs", "consistent"],
        "properties": {
            "node": {"type": "string"}, "leader": _NULLABLE_STR, "term": {"type": "integer"},
            "health": {"enum": ["ok", "degraded", "down"]}, "summary": {"type": "string"},
            "jobs": {"type": "integer"}, "active_runs": {"type": "integer"},
            "consistent": {"type": "boolean"}, "totals": {"type": "object"},
            "backfills": {"type": "array", "items": {"$ref": "#/components/schemas/Backfill"}},
            "concurrency": {"type": "array", "items": {
                "type": "object", "required": ["key", "max", "running", "queued"],
                "properties": {"key": {"type": "string"}, "max": {"type": "integer"},
                               "running": {"type": "integer"}, "holding": {"type": "integer"},
                               "queued": {"type": "integer"},
                               "jobs": {"type": "array", "items": {"type": "string"}}}}},
            "nodes": {"type": "array", "items": {
                "type": "object", "required": ["node_id", "alive", "connected"],
                "properties": {"node_id": {"type": "string"}, "alive": {
                    "type": "boolean", "description": "The leader's verdict; without a "
                    "leader (health down), whether the serving node is connected to it."},
                               "connected": {"type": "boolean"},
                               "skew_ms": _NULLABLE_INT}}}}},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


#: Error responses every API route may give (the msgpack API's codes, as statuses).
_ERRORS = {str(code): _json("Error", text) for code, text in (
    (400, "invalid_spec / invalid_argument: the message names the field"),
    (401, "unauthenticated: no or a wrong bearer token"),
    (403, "forbidden: a read-only token tried to write"),
    (404, "unknown_job / unknown_run"), (409, "conflict"), (413, "frame_too_large"),
    (429, "limit_exceeded / overloaded"),
    (503, "not_ready / unavailable: no quorum; node_unavailable: the node holding it is "
          "down"))}

_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_STALE = {"name": "stale", "in": "query", "schema": {"type": "boolean"},
          "description": "answer from this node's state without waiting to catch up"}
_RID = {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"},
        "description": "the request id: a retried write with the same key is applied once"}


def _op(summary: str, ok: dict[str, Any], *, params: list[Any] | None = None,
        body: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": summary, "parameters": params or [],
                           "responses": dict(ok, **_ERRORS)}
    if body is not None:
        out["requestBody"] = {"content": {"application/json": {"schema": _ref(body)}}}
    out.update(extra or {})
    return out


def _flags(*names: str) -> dict[str, Any]:
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": {
        "type": "object", "properties": {n: {"type": "boolean"} for n in names}}}}}}


PATHS: dict[str, Any] = {
    "/api/v1/jobs": {
        "get": _op("List jobs (sorted by id)", {"200": _json("JobList")}, params=[
            {"name": "prefix", "in": "query", "schema": {"type": "string"}},
            {"name": "limit", "in": "query", "schema": {"type": "integer"}}, _STALE]),
        "post": _op("Put several jobs at once (all or nothing); ?dry_run=true commits nothing",
                    {"200": {"description": "OK", "content": {"application/json": {"schema": {
                        "anyOf": [_ref("PutManyResult"), _ref("DryRun")]}}}}},
                    params=[_RID, {"name": "dry_run", "in": "query",
                                   "schema": {"type": "boolean"}}],
                    extra={"requestBody": {"content": {"application/json": {"schema": {
                        "type": "object", "required": ["specs"], "properties": {"specs": {
                            "type": "array", "items": _ref("JobSpec")}}}}}}}),
    },
    "/api/v1/jobs/{id}": {
        "get": _op("Get a job", {"200": _json("Job")}, params=[_ID, _STALE]),
        "put": _op("Create or update a job; ?dry_run=true says what would change",
                   {"200": {"description": "updated (or the dry run)", "content": {
                       "application/json": {"schema": {
                           "anyOf": [_ref("PutResult"), _ref("DryRun")]}}}},
                    "201": _json("PutResult", "created")},
                   params=[_ID, _RID, {"name": "dry_run", "in": "query",
                                       "schema": {"type": "boolean"}}], body="JobSpec"),
        "delete": _op("Delete a job", {"200": _json("Deleted")}, params=[_ID, _RID]),
    },
    "/api/v1/jobs/{id}/pause": {"post": _op("Pause a job", {"200": _json("Paused")},
                                            params=[_ID, _RID])},
    "/api/v1/jobs/{id}/resume": {"post": _op("Resume a job (catch_up: run missed fire times)",
                                             {"200": _json("Paused")}, params=[_ID, _RID],
                                             extra=_flags("catch_up"))},
    "/api/v1/jobs/{id}/trigger": {"post": _op("Run a job now", {"200": _json("Triggered")},
                                              params=[_ID, _RID], extra=_flags("force"))},
    "/api/v1/jobs/{id}/runs": {"get": _op(
        "A job's runs, newest first; page with before=<last scheduled_ms>",
        {"200": _json("RunList")}, params=[
            _ID, {"name": "limit", "in": "query", "schema": {"type": "integer"}},
            {"name": "before", "in": "query", "schema": {"type": "integer"}}, _STALE])},
    "/api/v1/jobs/{id}/next": {"get": _op(
        "The job's next fire times (its zone and UTC, DST days marked) and the schedule in "
        "words", {"200": _json("NextFires")},
        params=[_ID, {"name": "count", "in": "query", "schema": {"type": "integer"}}, _STALE])},
    "/api/v1/runs/{run}/logs": {"get": _op(
        "A run's full log (one stream, a chunk at a time), fetched from the node that ran "
        "it; 503 node_unavailable names that node when it does not answer",
        {"200": _json("RunLog")}, params=[
            {"name": "run", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "the run id, <job_id>@<scheduled_ms>"},
            {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
            {"name": "offset", "in": "query", "schema": {"type": "integer"},
             "description": "where to start; negative: that many bytes before the end"},
            {"name": "limit", "in": "query", "schema": {"type": "integer"},
             "description": "bytes at most (default 262144, at most 1048576)"},
            {"name": "attempt", "in": "query", "schema": {"type": "integer"},
             "description": "default: the newest attempt that ran"},
            {"name": "wait", "in": "query", "schema": {"type": "number"},
             "description": "seconds (<= 10) to wait for more output before answering"}])},
    "/api/v1/jobs/{id}/backfill": {"post": _op(
        "Run the job's fire times in from..to (past) once each, as one backfill",
        {"201": _json("Backfill", "started")}, params=[_ID, _RID],
        extra={"requestBody": {"content": {"application/json": {"schema": {
            "type": "object", "required": ["from", "to"],
            "properties": {"from": {"type": ["string", "integer"],
                                    "description": "RFC 3339 or epoch ms (inclusive)"},
                           "to": {"type": ["string", "integer"]},
                           "overlap": {"enum": ["allow", "skip", "queue"]},
                           "max": {"type": "integer", "minimum": 1, "maximum": 8},
                           "rerun": {"type": "boolean"}}}}}}})},
    "/api/v1/backfills": {"get": _op(
        "Running and recently finished backfills, newest first", {"200": _json("BackfillList")},
        params=[{"name": "job", "in": "query", "schema": {"type": "string"}}])},
    "/api/v1/backfills/{bf}/cancel": {"post": _op(
        "Cancel a backfill (its runs not started are cancelled)", {"200": _json("Backfill")},
        params=[{"name": "bf", "in": "path", "required": True, "schema": {"type": "string"}},
                _RID])},
    "/api/v1/preview": {"post": _op(
        "Next fire times of a spec that is not stored (needs only a read token)",
        {"200": _json("NextFires")}, extra={"requestBody": {"content": {"application/json": {
            "schema": {"type": "object", "required": ["spec"],
                       "properties": {"spec": _ref("JobSpec"),
                                      "count": {"type": "integer"}}}}}}})},
    "/api/v1/token": {"get": _op("What the presented token may do: admin (reads and writes) "
                                 "or read (GET only)", {"200": _json("TokenRole")})},
    "/api/v1/status": {"get": _op("Cluster health as this node sees it",
                                  {"200": _json("Status")}, params=[_STALE])},
    "/api/v1/events": {"get": {
        "summary": "Server-Sent Events: one JSON object per data line (run.*, job.*, "
                   "leader.changed, node.*); a client too slow to read is dropped",
        "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"},
                        "description": "end the stream after this many events"}],
        "responses": {"200": {"description": "an event stream",
                              "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                      "400": _ERRORS["400"], "401": _ERRORS["401"],
                      "429": _ERRORS["429"]}}},
}

_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "raftsched HTTP API", "version": "1",
             "description": "The msgpack API's operations over HTTP/JSON. Authenticate with "
                            "'Authorization: Bearer <token>' (`raftsched http-token`; "
                            "--read-only for a token that may only GET)."},
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "paths": PATHS,
    "components": {"schemas": SCHEMAS,
                   "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
}


def document() -> dict[str, Any]:
    """A copy of the OpenAPI document."""
    return copy.deepcopy(_DOCUMENT)


__all__ = ["PATHS", "SCHEMAS", "document"]
