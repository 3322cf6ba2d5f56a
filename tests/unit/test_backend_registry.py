"""The backend registry (schemas/backend_registry.py): what loading a run config imports, and that every registered model names code that is there."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from schemas import backend_registry
from schemas.backend_config import STAGE_NAMES, TrainBackendConfig
from schemas.backend_registry import BackendRegistryError, all_configs, backend_type, import_path, stage_configs

REPO = Path(__file__).resolve().parents[2]


def test_loading_the_run_config_imports_only_the_vendors_folders() -> None:
    code = "import json, sys; import schemas.run_config; print(json.dumps(sorted(sys.modules)))"
    modules = json.loads(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout)
    ours = [name for name in modules if name == "metarl" or name.startswith("metarl.")]
    vendor_packages = {module.rsplit(".", 1)[0] for module in backend_registry.VENDOR_CONFIGS.values()}
    outside = [name for name in ours if name not in ("metarl", "metarl.backends") and not any(name == p or name.startswith(p + ".") for p in vendor_packages)]
    assert outside == []
    assert "metarl.backends.runpod.train" not in ours and "metarl.backends.local.train" not in ours  # only what configs need, not the backends
    heavy = [name for name in ("torch", "sqlalchemy", "celery", "runpod", "tinker", "vllm", "psycopg") if name in modules]
    assert heavy == []


def test_every_registered_model_names_a_class_that_builds_itself_and_a_planner() -> None:
    for model in all_configs():
        backend_class = import_path(model.backend_class)
        assert callable(getattr(backend_class, "from_run_config", None)), model.backend_class
        assert callable(import_path(model.planner)), model.planner


def test_each_stage_offers_its_types() -> None:
    offered = {stage: sorted(backend_type(model) for model in stage_configs(stage)) for stage in STAGE_NAMES}
    assert offered == {
        "agent": ["local", "sim", "tinker"],
        "train": ["local", "runpod", "sim"],
        "eval": ["local", "pod_vllm", "sim", "vllm"],
        "outer": ["local", "sim", "tinker"],
    }


def registry_error_with_vendor(monkeypatch: pytest.MonkeyPatch, module_name: str, models: tuple[type[TrainBackendConfig], ...]) -> str:
    """The error the registry raises once a vendor whose config module lists ``models`` is added to it (the registry is restored after)."""
    module = types.ModuleType(module_name)
    module.CONFIGS = models  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setitem(backend_registry.VENDOR_CONFIGS, module_name, module_name)
    all_configs.cache_clear()
    try:
        with pytest.raises(BackendRegistryError) as error:
            all_configs()
    finally:
        monkeypatch.undo()
        all_configs.cache_clear()
    return str(error.value)


def test_two_vendors_claiming_one_type_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class AnotherSimTrain(TrainBackendConfig):
        """Claims the simulator's train type."""

        type: Literal["sim"]
        weights: ClassVar[str] = "simulated"

    assert "both claim train type 'sim'" in registry_error_with_vendor(monkeypatch, "clashing_vendor_config", (AnotherSimTrain,))


def test_a_path_to_nothing_names_the_path() -> None:
    with pytest.raises(BackendRegistryError, match="has no 'Nothing'"):
        import_path("schemas.backend_registry:Nothing")


def test_a_train_model_that_does_not_say_what_weights_it_makes_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class SilentTrain(TrainBackendConfig):
        """Declares no weights."""

        type: Literal["silent"]

    assert "SilentTrain of silent_vendor_config declares no `weights`" in registry_error_with_vendor(monkeypatch, "silent_vendor_config", (SilentTrain,))
