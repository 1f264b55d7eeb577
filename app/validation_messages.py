"""One line for a file that fails validation: the first problem, named by its path in the file.

An unknown key comes first, whatever pydantic's order: a typo (`ttft:` for `ttft_ms:`) also makes
the real key missing, and "ttft_ms: Field required" would send the reader looking for a key that
is, to their eyes, right there. The line names the unknown key and, when one is close, the key
that was probably meant; the "missing" error that the typo explains is not counted again.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError


def location(loc: tuple[Any, ...]) -> str:
    """`('deployments', 0, 'sla')` -> `deployments[0].sla`."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[") or "<root>"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or the members of a union, list, dict, Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _tag(model: type[BaseModel]) -> Any:
    """A discriminated union member's tag (its `type: Literal[...]`), else None."""
    field = model.model_fields.get("type")
    args = typing.get_args(field.annotation) if field is not None else ()
    return args[0] if len(args) == 1 else None


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[type[BaseModel]], tuple[Any, ...]]:
    """The models at `loc` (a pydantic error location), and `loc` as the file spells it: without
    the tags pydantic inserts for the member of a discriminated union (`connector.virtual`)."""
    models, spelled = [model], []
    for part in loc:
        if isinstance(part, int):
            spelled.append(part)
            continue  # a list item: _models_in has already looked inside the list
        tagged = [m for m in models if _tag(m) == part]
        if tagged:
            models = tagged
            continue
        spelled.append(part)
        models = [
            inner
            for m in models
            if (field := m.model_fields.get(str(part))) is not None
            for inner in _models_in(field.annotation)
        ]
    return models, tuple(spelled)


def keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The keys the model accepts at `loc`; None if it cannot tell."""
    models, _ = _walk(model, loc)
    return list(models[0].model_fields) if len(models) == 1 else None


def _spelled(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    return location(_walk(model, loc)[1] if model is not None else loc)


def message(error: Mapping[str, Any]) -> str:
    """A pydantic error's message without pydantic's prefix for a validator's own words ("Value
    error, must start with ..."): the validator's sentence is the message."""
    msg = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def describe_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> str:
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if not unknown:
        first = errors[0]
        more = len(errors) - 1
        where = _spelled(model, tuple(first["loc"]))
        return f"{source}: {where}: {message(first)}" + (f" (and {more} more)" if more else "")
    first = unknown[0]
    parent, key = tuple(first["loc"][:-1]), str(first["loc"][-1])
    missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
    known = keys_at(model, parent) if model is not None else None
    guess = difflib.get_close_matches(key, missing, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, known or [], n=1, cutoff=0.6
    )
    if guess:
        hint = f" (did you mean {guess[0]!r}?)"
    elif known:
        hint = f" (known keys: {', '.join(known)})"
    else:
        hint = ""
    # The key the typo stood for is missing because of the typo: one problem, not two.
    explained = 1 if guess and guess[0] in missing else 0
    more = len(errors) - 1 - explained
    where = _spelled(model, parent)
    return f"{source}: {where}: unknown key {key!r}{hint}" + (f" (and {more} more)" if more else "")
