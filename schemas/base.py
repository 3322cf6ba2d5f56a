"""Shared base model and TOML reading/writing with errors that name the field and the fix."""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.config_error import ConfigError, printable

MAX_TOML_BYTES = 1_000_000
MAX_TOML_DEPTH = 16

ModelT = TypeVar("ModelT", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config schema: unknown keys are rejected, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True)


class FieldProblem(BaseModel):
    """One problem with one field of a config file."""

    model_config = ConfigDict(extra="forbid")

    field: str
    message: str
    fix: str


def _fix_for(error_type: str, ctx: dict[str, Any] | None) -> str:
    ctx = ctx or {}
    if isinstance(ctx.get("fix"), str):
        return str(ctx["fix"])  # a validator that knows the fix names it (PydanticCustomError context)
    fixes = {
        "extra_forbidden": "remove this key (it is not part of the schema; check its spelling)",
        "missing": "add this key",
        "greater_than_equal": f"use a value >= {ctx.get('ge')}",
        "greater_than": f"use a value > {ctx.get('gt')}",
        "less_than_equal": f"use a value <= {ctx.get('le')}",
        "less_than": f"use a value < {ctx.get('lt')}",
        "string_too_long": f"use at most {ctx.get('max_length')} characters",
        "string_too_short": f"use at least {ctx.get('min_length')} characters",
        "too_long": f"use at most {ctx.get('max_length')} items",
        "too_short": f"use at least {ctx.get('min_length')} items",
        "literal_error": f"use one of {ctx.get('expected')}",
        "union_tag_invalid": f"set `{str(ctx.get('discriminator', 'type')).strip(chr(39))}` to one of {ctx.get('expected_tags')}",
        "union_tag_not_found": f"add a `{str(ctx.get('discriminator', 'type')).strip(chr(39))}` key naming the kind",
        "string_pattern_mismatch": f"match the pattern {ctx.get('pattern')}",
        "control_character": "remove control characters and escape sequences (plain text only; a description may use newlines and tabs)",
        "dataset_size_range": "make min_dataset_size at most max_dataset_size",
        "items_source": 'set either pool = "<file>.jsonl" or generator = "<family>" in [items], not both',
    }
    if error_type in fixes:
        return fixes[error_type]
    if error_type.endswith("_type") or error_type.endswith("_parsing"):
        return "use a value of the right type (see the message)"
    return "correct the value as the message says"


_BARE_KEY = re.compile(r"^[A-Za-z0-9_\-]+$")


def field_path(loc: tuple[Any, ...], data: Any) -> str:
    """The TOML path of a pydantic error location: union tags dropped, odd keys quoted and escaped."""
    parts: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part not in node and part in (node.get("type"), node.get("kind")):
            continue  # the discriminated-union tag pydantic adds to the location
        if isinstance(part, int) or _BARE_KEY.match(str(part)):
            parts.append(str(part))
        else:
            parts.append('"' + printable(str(part)).replace('"', '\\"') + '"')
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return ".".join(parts) or "(top level)"


def problems_from_validation(err: ValidationError, data: Any = None) -> list[FieldProblem]:
    problems = []
    for item in err.errors(include_url=False):
        loc = field_path(tuple(item["loc"]), data)
        message = str(item["msg"])
        if item["type"] == "value_error" and message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        problems.append(FieldProblem(field=loc, message=message, fix=_fix_for(item["type"], item.get("ctx"))))
    return problems


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_TOML_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()], default=level + 1)
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value], default=level + 1)
    return level


def parse_toml_text(text: str | bytes, source: str) -> dict[str, Any]:
    """Parse TOML text with size and depth limits; raise ConfigError naming the problem."""
    if isinstance(text, bytes):
        if len(text) > MAX_TOML_BYTES:
            raise ConfigError(source, [FieldProblem(field="(file)", message=f"file is {len(text)} bytes", fix=f"keep it under {MAX_TOML_BYTES} bytes")])
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(source, [FieldProblem(field="(file)", message=f"not valid UTF-8 at byte {exc.start}", fix="save the file as UTF-8")]) from None
    if len(text) > MAX_TOML_BYTES:
        raise ConfigError(source, [FieldProblem(field="(file)", message=f"file is {len(text)} characters", fix=f"keep it under {MAX_TOML_BYTES} bytes")])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [FieldProblem(field="(syntax)", message=f"invalid TOML: {exc}", fix="correct the TOML syntax at that line")]) from None
    except RecursionError:
        data = None
    if data is None or _depth(data) > MAX_TOML_DEPTH:
        raise ConfigError(
            source, [FieldProblem(field="(structure)", message="tables or arrays are nested too deeply", fix=f"nest at most {MAX_TOML_DEPTH} levels")]
        )
    return data


def validate_model(model_type: type[ModelT], data: dict[str, Any], source: str) -> ModelT:
    """Validate a parsed mapping against a schema; raise ConfigError with one entry per bad field."""
    try:
        return model_type.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, problems_from_validation(err, data)) from None


def load_toml_model(model_type: type[ModelT], path: str | Path) -> ModelT:
    """Read a TOML file into a schema; every failure is a ConfigError naming the file and field."""
    return validate_model(model_type, read_toml_file(path), str(path))


def read_toml_file(path: str | Path) -> dict[str, Any]:
    """Read and parse a TOML file with the size and depth limits; every failure is a ConfigError naming the file."""
    path = Path(path)
    source = str(path)

    def problem(message: str, fix: str) -> ConfigError:
        return ConfigError(source, [FieldProblem(field="(file)", message=message, fix=fix)])

    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise problem("is a directory", "give the path of a TOML file")
        if not stat.S_ISREG(info.st_mode):
            raise problem("is not a regular file", "give the path of a TOML file")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TOML_BYTES + 1)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise problem("file not found", "check the path") from None
    except PermissionError:
        raise problem("permission denied", "make the file readable") from None
    except OSError as exc:
        raise problem(f"cannot read it: {exc.strerror or exc}", "check the path") from None
    except ValueError as exc:  # e.g. an embedded NUL byte
        raise problem(f"invalid path: {exc}", "check the path") from None
    return parse_toml_text(raw, source)


def dump_toml_model(model: BaseModel) -> str:
    """Serialise a schema to TOML text (None values are left out, as TOML has no null)."""
    return tomli_w.dumps(model.model_dump(mode="json", exclude_none=True))
