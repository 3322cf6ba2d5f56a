"""Which vendor folders offer backends: one line each, naming the vendor's config module.

Adding a backend is a folder under `metarl/backends/` (its config models, its plan, its classes)
and a line here. A config module imports only `schemas` and pydantic, and lists its models in
``CONFIGS``; the run config validates each stage's table against the models of that stage
(:func:`stage_configs`). The backend classes themselves are imported only when a run uses them
(each model's ``backend_class`` path, `metarl/composition.py`).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from schemas.backend_config import BackendConfig, StageName

VENDOR_CONFIGS: dict[str, str] = {
    "sim": "metarl.backends.sim.config",
    "local": "metarl.backends.local.config",
    "vllm": "metarl.backends.vllm.config",
    "runpod": "metarl.backends.runpod.config",
    "tinker": "metarl.backends.tinker.config",
}
"""Vendor -> the module holding its config models (``CONFIGS``)."""


class BackendRegistryError(RuntimeError):
    """A vendor config module is missing, lists no models, or two models claim one stage's type."""


@functools.cache
def all_configs() -> tuple[type[BackendConfig], ...]:
    """Every registered backend config model, in registry order (imports the vendors' config modules once)."""
    found: list[type[BackendConfig]] = []
    seen: dict[tuple[StageName, str], str] = {}
    for vendor, module_name in VENDOR_CONFIGS.items():
        models = getattr(importlib.import_module(module_name), "CONFIGS", None)
        if not models:
            raise BackendRegistryError(f"{module_name} (vendor {vendor!r}) defines no CONFIGS: list its backend config models there")
        for model in models:
            key = (model.stage, backend_type(model))
            if key in seen:
                raise BackendRegistryError(f"{model.__name__} of {module_name} and a model of {seen[key]} both claim {key[0]} type {key[1]!r}")
            seen[key] = module_name
            declares = {"train": "weights", "eval": "scores"}.get(model.stage)
            if declares is not None and not hasattr(model, declares):
                raise BackendRegistryError(
                    f"{model.__name__} of {module_name} declares no `{declares}`: a {model.stage} backend says which trained weights it "
                    f"{'makes' if model.stage == 'train' else 'can score'} (schemas/backend_config.py)"
                )
            found.append(model)
    return tuple(found)


def backend_type(model: type[BackendConfig]) -> str:
    """The `type` value that picks a config model: the one value of its `type: Literal[...]` annotation."""
    values: tuple[Any, ...] = getattr(model.model_fields["type"].annotation, "__args__", ())
    if len(values) != 1 or not isinstance(values[0], str):
        raise BackendRegistryError(f"{model.__name__}.type must be Literal['<one type name>']")
    return values[0]


def stage_configs(stage: StageName) -> tuple[type[BackendConfig], ...]:
    """The config models offered for one stage."""
    return tuple(model for model in all_configs() if model.stage == stage)


def import_path(path: str) -> Any:
    """The object a ``module:name`` path names (a backend config's ``backend_class`` or ``planner``), imported now."""
    module_name, _, name = path.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, name)
    except AttributeError:
        raise BackendRegistryError(f"{module_name} has no {name!r} (named by a backend config as {path!r})") from None
