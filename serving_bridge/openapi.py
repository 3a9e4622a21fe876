"""The scoring API's OpenAPI 3.1 description, and the request validator that reads it.

The description is the single source of truth for the request schema: ``GET /openapi.json`` serves
:func:`openapi_spec`, and the server validates every ``POST /score`` body with :func:`validate`
against ``components.schemas.ScoreRequest`` of that same document. The validator implements the
JSON Schema keywords the document uses (type, required, properties, additionalProperties, enum,
min/maxItems, min/maxLength, maxProperties) and fails loudly on any other, so the two cannot drift.

>>> spec = openapi_spec(max_candidates=2)
>>> validate(request_schema(spec), {"user_id": "u1", "items": ["a", "b", "c"]})
Traceback (most recent call last):
...
ValueError: items: at most 2 entries, got 3
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_ID_CHARS", "openapi_spec", "request_schema", "validate"]

MAX_ID_CHARS = 256  # longest user id, item id, context key or value accepted
MAX_CONTEXT_ENTRIES = 64

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openapi_spec(max_candidates: int = 1_000, auth: bool = False) -> dict[str, Any]:
    """The API description; ``max_candidates`` and ``auth`` follow the replica's configuration."""
    ident = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
    schemas = {
        "ScoreRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["user_id", "items"],
            "properties": {
                "user_id": {**ident, "description": "the raw user id (pseudonymized by the replica)"},
                "context": {
                    "type": "object",
                    "description": "categorical context of the request (site, device, ...)",
                    "maxProperties": MAX_CONTEXT_ENTRIES,
                    "additionalProperties": {"type": "string", "maxLength": MAX_ID_CHARS},
                },
                "items": {
                    "type": "array",
                    "description": "candidate item ids, scored in this order",
                    "minItems": 1,
                    "maxItems": max_candidates,
                    "items": ident,
                },
            },
        },
        "ScoreResponse": {
            "type": "object",
            "required": ["version", "arm", "replica", "probabilities"],
            "properties": {
                "version": {"type": "string", "description": "the model version that made every score"},
                "arm": {"type": "string", "enum": ["champion", "challenger"]},
                "replica": {"type": "string"},
                "probabilities": {"type": "array", "items": {"type": "number"}},
            },
        },
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    }
    score: dict[str, Any] = {
        "summary": "click probability of one user for each candidate item",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}},
        },
        "responses": {
            "200": _json({"$ref": "#/components/schemas/ScoreResponse"}, "one probability per candidate"),
            "400": _json(_ERROR, "bad JSON or a body that does not match ScoreRequest"),
            "401": _json(_ERROR, "missing or wrong bearer token (when the replica has one)"),
            "405": _json(_ERROR, "a method other than POST (the response's Allow says which)"),
            "408": _json(_ERROR, "the body did not arrive in full within a few seconds"),
            "411": _json(_ERROR, "no Content-Length"),
            "413": _json(_ERROR, "body larger than serving.max_body_bytes"),
            "503": _json(_ERROR, "overloaded or no model loaded yet; retry after Retry-After seconds"),
        },
    }
    if auth:
        score["security"] = [{"bearer": []}]
    plain = {"200": {"description": "ok"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "ctr-online scoring replica", "version": "1"},
        "paths": {
            "/score": {"post": score},
            "/healthz": {"get": {"summary": "200 while the process runs", "responses": plain}},
            "/readyz": {
                "get": {
                    "summary": "200 once a model is loaded",
                    "responses": {**plain, "503": {"description": "no model"}},
                }
            },
            "/version": {
                "get": {"summary": "the champion and challenger versions served", "responses": plain}
            },
            "/metrics": {"get": {"summary": "Prometheus text", "responses": plain}},
            "/openapi.json": {"get": {"summary": "this document", "responses": plain}},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def request_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``ScoreRequest`` schema of ``spec``."""
    schema: dict[str, Any] = spec["components"]["schemas"]["ScoreRequest"]
    return schema


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
}
_KNOWN = {
    "type", "required", "properties", "additionalProperties", "enum", "minItems", "maxItems",
    "minLength", "maxLength", "maxProperties", "items", "description",
}  # fmt: skip


def validate(schema: dict[str, Any], value: Any, where: str = "") -> None:
    """Raise ``ValueError("<path>: <what is wrong>")`` if ``value`` does not match ``schema``."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise NotImplementedError(f"openapi: the validator does not implement {sorted(unknown)}")
    at = where or "body"
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _TYPES[kind]) and not (kind != "boolean" and isinstance(value, bool))
        if not ok:
            raise ValueError(f"{at}: must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, got {_name(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{at}: must be one of {schema['enum']}")
    if isinstance(value, str):
        _check_unicode(value, at)
        if len(value) < schema.get("minLength", 0):
            raise ValueError(f"{at}: must not be empty" if not value else f"{at}: too short")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ValueError(f"{at}: longer than {schema['maxLength']} characters")
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise ValueError(f"{at}: at least {schema['minItems']} entries, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ValueError(f"{at}: at most {schema['maxItems']} entries, got {len(value)}")
        if "items" in schema:
            for i, v in enumerate(value):
                validate(schema["items"], v, f"{at}[{i}]")
    elif isinstance(value, dict):
        _validate_object(schema, value, where)


def _validate_object(schema: dict[str, Any], value: dict[str, Any], where: str) -> None:
    at = where or "body"
    missing = [k for k in schema.get("required", ()) if k not in value]
    if missing:
        raise ValueError(f"{at}: missing required field(s) {missing}")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        raise ValueError(f"{at}: at most {schema['maxProperties']} entries, got {len(value)}")
    props: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    if extra is False:
        unknown = sorted(set(value) - set(props))
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {unknown}; allowed: {sorted(props)}")
    for key, v in value.items():
        _check_unicode(key, f"{at} key {key!r}")
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if sub is not None:
            validate(sub, v, f"{where}.{key}" if where else key)


def _check_unicode(value: str, at: str) -> None:
    """JSON's ``"\\ud800"`` parses to a lone surrogate: not Unicode text, and no UTF-8 encodes it
    (the pseudonymizer and the feature hashing would raise on it later)."""
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"{at}: not valid Unicode (a lone surrogate at character {exc.start})") from None


def _name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", dict: "an object", list: "an array", str: "a string"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )
