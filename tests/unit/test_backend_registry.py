"""The backend registry (schemas/backend_registry.py): what loading a run config imports, and that every registered model names code that is there."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from schemas import backend_registry
from schemas.backend_config import STAGE_NAMES, TrainBackendConfig
from schemas.backend_registry import BackendRegistryError, all_configs, backend_type, config_for, import_path, stage_configs

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
        assert config_for(model.stage, backend_type(model)) is model


def test_each_stage_offers_its_types() -> None:
    offered = {stage: sorted(backend_type(model) for model in stage_configs(stage)) for stage in STAGE_NAMES}
    assert offered == {
        "agent": ["local", "sim", "tinker"],
        "train": ["local", "runpod", "sim"],
        "eval": ["local", "pod_vllm", "sim", "vllm"],
        "outer": ["local", "sim", "tinker"],
    }


def test_two_vendors_claiming_one_type_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from typing import Literal

    class AnotherSimTrain(TrainBackendConfig):
        """Claims the simulator's train type."""

        type: Literal["sim"]

    module = types.ModuleType("clashing_vendor_config")
    module.CONFIGS = (AnotherSimTrain,)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clashing_vendor_config", module)
    monkeypatch.setitem(backend_registry.VENDOR_CONFIGS, "clash", "clashing_vendor_config")
    all_configs.cache_clear()
    try:
        with pytest.raises(BackendRegistryError, match="both claim train type 'sim'"):
            all_configs()
    finally:
        monkeypatch.undo()
        all_configs.cache_clear()


def test_a_path_to_nothing_names_the_path() -> None:
    with pytest.raises(BackendRegistryError, match="has no 'Nothing'"):
        import_path("schemas.backend_registry:Nothing")


def test_a_train_model_that_does_not_say_what_weights_it_makes_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from typing import Literal

    class SilentTrain(TrainBackendConfig):
        """Declares no weights."""

        type: Literal["silent"]

    module = types.ModuleType("silent_vendor_config")
    module.CONFIGS = (SilentTrain,)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "silent_vendor_config", module)
    monkeypatch.setitem(backend_registry.VENDOR_CONFIGS, "silent", "silent_vendor_config")
    all_configs.cache_clear()
    try:
        with pytest.raises(BackendRegistryError, match="SilentTrain of silent_vendor_config declares no `weights`"):
            all_configs()
    finally:
        monkeypatch.undo()
        all_configs.cache_clear()
