"""``gpufleet service``'s input: a spec file (YAML or JSON), flags turned into spec
fields, and pydantic's complaints as one line (no value echoed: an env value may be a
secret). No command here: ``service_cmds`` has them."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.timefmt import parse_duration

M = TypeVar("M", bound=BaseModel)
DURATIONS = ("readiness_timeout", "scale_up_stabilization", "scale_down_cooldown", "progress_deadline")
"""Spec fields a flag gives as a duration (``300``, ``5m``)."""


def problems(exc: ValidationError) -> str:
    """Pydantic's errors as one line: ``field: message; ...`` (no input echoed: an env
    value may be a secret)."""
    said = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "no such field"
        said.append(f"{where}: {msg}" if where else msg)
    return "; ".join(said)


def validated(model: type[M], body: dict[str, Any], what: str) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise fail(f"{what}: {problems(exc)}", BAD_INPUT) from None


def read_spec_file(source: str) -> dict[str, Any]:
    """A spec file's fields: JSON by a ``.json`` name, YAML by ``.yaml``/``.yml``; else
    (and ``-``, stdin) JSON, then YAML."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read {source}: {getattr(exc, 'strerror', None) or exc}", BAD_INPUT) from None
    label = "stdin" if source == "-" else source
    suffix = Path(source).suffix.lower()
    if suffix == ".json":
        data = _json(text, label)
    elif suffix in (".yaml", ".yml"):
        data = _yaml(text, label)
    else:
        try:
            data = json.loads(text)
        except ValueError:
            data = _yaml(text, label)
    if not isinstance(data, dict):
        raise fail(f"{label}: a spec is a mapping of fields (name: ..., command: ...)", BAD_INPUT)
    if isinstance(data.get("command"), str):
        data["command"] = _split(data["command"], f"{label}: command")
    return data


class DuplicateKeyError(ValueError):
    """A key given twice in one mapping of a spec: YAML and JSON parsers keep the last
    one silently, so a second ``env:`` or ``replicas:`` would undo the first unseen."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"the key {key!r} is given twice")
        out[key] = value
    return out


def _json(text: str, label: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise fail(f"{label}: not valid JSON ({exc})", BAD_INPUT) from None


def _strict_loader() -> type[Any]:
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, naming it and
    its line (``DuplicateKeyError`` under yaml's ``ConstructorError``)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"the key {key!r} is given twice (lines {seen[key]} and {line})",
                        key_node.start_mark,
                    )
                if isinstance(key, str | int | float | bool):
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _yaml(text: str, label: str) -> Any:
    import yaml  # only deploy reads YAML

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc
        raise fail(f"{label}: not valid YAML{where}: {problem}", BAD_INPUT) from None


def _split(command: str, what: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise fail(f"{what}: {exc}", BAD_INPUT) from None


def env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise fail(f"--env {pair!r}: write KEY=VALUE", BAD_INPUT)
        out[key] = value
    return out


def spec_fields(given: dict[str, Any]) -> dict[str, Any]:
    """The spec fields the options name: ``--command`` split, ``--readiness-timeout`` in
    seconds, options not given left out."""
    out = {k: v for k, v in given.items() if v is not None}
    if "command" in out:
        out["command"] = _split(out["command"], "--command")
    for key in DURATIONS:
        if key in out:
            try:
                out[key] = parse_duration(out[key])
            except ValueError as exc:
                raise fail(f"--{key.replace('_', '-')}: {exc}", BAD_INPUT) from None
    return out
