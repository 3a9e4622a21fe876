"""The scoring API's request and response models (pydantic), and the OpenAPI 3.1 document made from them.

One definition, two uses, so the served description and the validation cannot drift: the server
validates every ``POST /score`` body with :meth:`ScoreRequest.model_validate_json` (pydantic-core's
parser: strict types, UTF-8, a recursion limit, lone surrogate escapes refused), and
``GET /openapi.json`` serves :func:`openapi_spec`, whose ``components.schemas`` are those same
models' JSON Schemas (every JSON answer, the probes' too, is one of them). The paths table below
names, per route, its summary, the status codes the server answers, their models and the header
each always carries (``Allow`` on 405, ``Retry-After`` on 503, ``WWW-Authenticate`` on 401);
:func:`error_message` turns pydantic's errors into the one-line ``{"error": ...}`` the API answers.

>>> model = score_request_model(max_candidates=2)
>>> try:
...     model.model_validate_json(b'{"user_id": "u1", "items": ["a", "b", "c"]}')
... except ValueError as exc:
...     print(error_message(exc))
items: at most 2 entries, got 3
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.json_schema import SkipJsonSchema

__all__ = [
    "MAX_CONTEXT_ENTRIES",
    "MAX_ID_CHARS",
    "ErrorBody",
    "HealthBody",
    "ItemRequest",
    "ReadyBody",
    "ScoreResponse",
    "VersionBody",
    "component_schemas",
    "error_message",
    "openapi_spec",
    "score_request_model",
]

MAX_ID_CHARS = 256  # longest user id, item id, context key or value accepted
MAX_CONTEXT_ENTRIES = 64

Ident = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
Text = Annotated[str, StringConstraints(max_length=MAX_ID_CHARS)]
Number = Annotated[float, Field(allow_inf_nan=False)]  # a dense input: a JSON number (1 or 1.5), finite


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # the field is left out, never null: "default": null would say otherwise


class ScoreResponse(BaseModel):
    """One probability per candidate, in the request's order, and what made them.

    ``conversion_probabilities`` is there only when the version that scored predicts conversions
    (a multi-task model, ESMM): the answer is sent with ``exclude_none``, so a click-only model's
    answer has no such key (not a null), and the schema lists it as optional and not nullable.
    """

    version: str = Field(description="the model version that made every score")
    arm: Literal["champion", "challenger"] = Field(description="the A/B arm that scored")
    replica: str
    probabilities: list[float] = Field(description="click probability (pCTR) per candidate, in order")
    conversion_probabilities: list[float] | SkipJsonSchema[None] = Field(
        default=None,
        description="conversion probability after a click (pCVR, P(conversion | click)) per candidate, "
        "in the order of probabilities; pCTR x pCVR is the impression's probability of converting. "
        "Absent (not null) when the model predicts clicks only",
        json_schema_extra=_no_default,
    )


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer: what was wrong and, where it helps, what to do."""

    error: str


class HealthBody(BaseModel):
    """``GET /healthz``: the process runs."""

    status: Literal["ok"]


class ReadyBody(BaseModel):
    """``GET /readyz``: whether a model is loaded (200) or not yet (503), and which."""

    ready: bool
    version: str | None = Field(description="the champion version, null before the first is loaded")


class VersionBody(BaseModel):
    """``GET /version``: the versions this replica serves."""

    version: str | None = Field(description="the champion version, null before the first is loaded")
    challenger: str | None = Field(description="the challenger version, null when there is none")
    replica: str


class ItemRequest(BaseModel):
    """A candidate with numeric inputs of its own (e.g. an affinity), beside the request's."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: Ident = Field(description="the item id")
    dense: Annotated[dict[Text, Number], Field(max_length=MAX_CONTEXT_ENTRIES)] = Field(
        default_factory=dict,
        description="numeric inputs of this item; they add to and override the request's",
    )


@functools.cache
def score_request_model(max_candidates: int = 1_000) -> type[BaseModel]:
    """The ``ScoreRequest`` model; ``items`` holds at most ``max_candidates`` (serving.max_candidates)."""

    class ScoreRequest(BaseModel):
        """Click probability of one user for each candidate item."""

        model_config = ConfigDict(extra="forbid", strict=True)
        user_id: Ident = Field(description="the raw user id (pseudonymized by the replica)")
        context: Annotated[dict[Text, Text], Field(max_length=MAX_CONTEXT_ENTRIES)] = Field(
            default_factory=dict, description="categorical context of the request (site, device, ...)"
        )
        items: Annotated[
            list[Annotated[Ident | ItemRequest, Field(union_mode="left_to_right")]],
            Field(min_length=1, max_length=max_candidates),
        ] = Field(
            description="candidate items, scored in this order: an item id, or an object with the id "
            "and the item's own numeric inputs"
        )
        dense: Annotated[dict[Text, Number], Field(max_length=MAX_CONTEXT_ENTRIES)] = Field(
            default_factory=dict,
            description="numeric inputs of the request, the same for every item (e.g. bid_floor); "
            "a missing one is 0, as in training",
        )

    return ScoreRequest


# route -> (method, summary, {status: (description, model name, header the answer always has)});
# model "object" is any JSON object (this document), "text" Prometheus's text format
Answers = dict[str, tuple[str, str] | tuple[str, str, str]]
_SCORE_ANSWERS: Answers = {
    "200": ("one probability per candidate (and its pCVR, for a multi-task model)", "ScoreResponse"),
    "400": ("bad JSON or a body that does not match ScoreRequest", "ErrorBody"),
    "401": ("missing or wrong bearer token (when the replica has one)", "ErrorBody", "WWW-Authenticate"),
    "405": ("a method other than POST", "ErrorBody", "Allow"),
    "408": ("the body did not arrive in full within a few seconds", "ErrorBody"),
    "411": ("no Content-Length", "ErrorBody"),
    "413": ("body larger than serving.max_body_bytes", "ErrorBody"),
    "500": ("the model failed on a valid request (see the replica's log)", "ErrorBody"),
    "503": ("overloaded or no model loaded yet; retry after Retry-After seconds", "ErrorBody", "Retry-After"),
}
_GET_405: Answers = {"405": ("a method other than GET", "ErrorBody", "Allow")}
ROUTES: dict[str, tuple[str, str, Answers]] = {
    "/score": ("post", "click probability of one user for each candidate item", _SCORE_ANSWERS),
    "/healthz": ("get", "200 while the process runs", {"200": ("ok", "HealthBody"), **_GET_405}),
    "/readyz": (
        "get",
        "200 once a model is loaded",
        {"200": ("a model is loaded", "ReadyBody"), "503": ("no model yet", "ReadyBody"), **_GET_405},
    ),
    "/version": (
        "get",
        "the champion and challenger versions served",
        {"200": ("ok", "VersionBody"), **_GET_405},
    ),
    "/metrics": ("get", "Prometheus text exposition", {"200": ("ok", "text"), **_GET_405}),
    "/openapi.json": ("get", "this document", {"200": ("ok", "object"), **_GET_405}),
}
_HEADER_VALUES = {  # what each declared header holds
    "Allow": {"type": "string", "enum": ["GET", "POST"]},
    "Retry-After": {"type": "string", "pattern": "^[0-9]+$"},
    "WWW-Authenticate": {"type": "string", "pattern": "^Bearer "},
}


def _answer(description: str, model: str, header: str | None = None) -> dict[str, Any]:
    if model == "text":
        content = {"text/plain": {"schema": {"type": "string"}}}
    else:
        schema = {"type": "object"} if model == "object" else {"$ref": f"#/components/schemas/{model}"}
        content = {"application/json": {"schema": schema}}
    answer: dict[str, Any] = {"description": description, "content": content}
    if header is not None:
        answer["headers"] = {header: {"required": True, "schema": _HEADER_VALUES[header]}}
    return answer


_ANSWER_MODELS = (ScoreResponse, ErrorBody, HealthBody, ReadyBody, VersionBody)


def component_schemas(name: str, model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema as OpenAPI components: under ``name``, and the models it nests
    (``ItemRequest``) beside it instead of in its ``$defs``, which ``#/components`` refs do not reach."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {**schema.pop("$defs", {}), name: schema}


def openapi_spec(max_candidates: int = 1_000, auth: bool = False) -> dict[str, Any]:
    """The API description; ``max_candidates`` and ``auth`` follow the replica's configuration."""
    schemas: dict[str, Any] = component_schemas("ScoreRequest", score_request_model(max_candidates))
    for m in _ANSWER_MODELS:
        schemas |= component_schemas(m.__name__, m)
    paths: dict[str, Any] = {}
    for path, (method, summary, answers) in ROUTES.items():
        op: dict[str, Any] = {
            "summary": summary,
            "responses": {code: _answer(*answer) for code, answer in answers.items()},
        }
        if path == "/score":
            body = {"$ref": "#/components/schemas/ScoreRequest"}
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
            if auth:
                op["security"] = [{"bearer": []}]
        paths[path] = {method: op}
    return {
        "openapi": "3.1.0",
        "info": {"title": "ctr-online scoring replica", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _where(loc: tuple[int | str, ...]) -> str:
    """``items[1].dense.x`` for pydantic's location; the member a union tried (``str``,
    ``ItemRequest``) is not a field and is left out."""
    out = ""
    for i, part in enumerate(p for p in loc if p not in _UNION_MEMBERS):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if i else str(part))
    return out or "body"


_UNION_MEMBERS = {"str", "ItemRequest", "constrained-str"}
_PHRASES = {
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be an array",
    "string_type": "must be a string",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
}


def _other_form(err: Any) -> bool:
    """An error of the union member that does not match the input's form (str vs object)."""
    kind, value = err["type"], err.get("input")
    return (kind == "string_type" and isinstance(value, dict)) or (
        kind == "model_type" and isinstance(value, str)
    )


def _raw_loc(errors: list[Any]) -> set[Any]:
    return {part for e in errors for part in e["loc"]}


def error_message(exc: ValidationError | ValueError) -> str:
    """One line for the first problem pydantic found, naming the field (``items[1]: ...``)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    errors = exc.errors(include_url=False)
    # an item is an id or an object: report what is wrong with the form it has, not the other's
    err = next((e for e in errors if not _other_form(e)), errors[0])
    if _other_form(err) or (err["type"] == "string_type" and "ItemRequest" in _raw_loc(errors)):
        got = _name(err.get("input"))
        return f"{_where(err['loc'])}: an item is an id (string) or an object {{id, dense}}, got {got}"
    kind, at, ctx = err["type"], _where(err["loc"]), err.get("ctx") or {}
    if kind == "json_invalid":
        why = str(ctx.get("error", err["msg"]))
        if "recursion limit" in why:
            return f"body is not valid JSON: nested too deeply ({why})"
        if "surrogate" in why or "hex escape" in why:
            return f"body is not valid Unicode text: {why} (a lone surrogate such as \\ud800 is no character)"
        return f"body is not valid JSON: {why}"
    if kind == "json_type":
        return "body is not valid JSON"
    if kind == "missing":
        parent, name = _where(err["loc"][:-1]), err["loc"][-1]
        return f"{parent}: missing required field(s) [{name!r}]"
    if kind == "extra_forbidden":
        parent, name = _where(err["loc"][:-1]), err["loc"][-1]
        return f"{parent}: unknown field(s) [{name!r}]; allowed: {sorted(score_request_model().model_fields)}"
    if kind == "too_short":
        return f"{at}: at least {ctx.get('min_length')} entries, got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"{at}: at most {ctx.get('max_length')} entries, got {ctx.get('actual_length')}"
    if kind == "string_too_short":
        return f"{at}: must not be empty"
    if kind == "string_too_long":
        return f"{at}: longer than {ctx.get('max_length')} characters"
    if kind in _PHRASES:
        return f"{at}: {_PHRASES[kind]}, got {_name(err.get('input'))}"
    return f"{at}: {err['msg']}"


def _name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)
