"""The compiled environment package: load_environment() against stand-ins for verifiers and datasets.

verifiers (the commit prime-rl v0.8.0 pins) is not installed here; the stand-ins record what
the package builds with the parts of its API the package uses: ``vf.Rubric(funcs=, weights=)``,
``vf.SingleTurnEnv(dataset=, system_prompt=, rubric=)`` and ``datasets.Dataset.from_list``.
Reward functions are called the way verifiers' Rubric calls them: keyword arguments, chat
messages for prompt and completion.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import types
from pathlib import Path

import pytest

from metarl import graders
from metarl.backends.local.agent import environment_source
from metarl.backends.runpod.pod.manifest import sha256_hex
from metarl.backends.runpod.primerl import compiler
from metarl.backends.runpod.primerl.compiler import build_bundle, compile_bundle, write_bundle
from schemas.job import DEFAULT_MAX_TOKENS, JobSpec


class FakeRubric:
    def __init__(self, funcs: list, weights: list) -> None:
        self.funcs, self.weights = funcs, weights


class FakeSingleTurnEnv:
    def __init__(self, dataset: object, system_prompt: str | None, rubric: FakeRubric, **kwargs: object) -> None:
        self.dataset, self.system_prompt, self.rubric, self.kwargs = dataset, system_prompt, rubric, kwargs


class FakeDataset:
    @classmethod
    def from_list(cls, rows: list[dict]) -> FakeDataset:
        dataset = cls()
        dataset.rows = rows
        return dataset


@pytest.fixture
def fake_vf(monkeypatch: pytest.MonkeyPatch) -> None:
    verifiers = types.ModuleType("verifiers")
    verifiers.Rubric = FakeRubric  # type: ignore[attr-defined]
    verifiers.SingleTurnEnv = FakeSingleTurnEnv  # type: ignore[attr-defined]
    datasets = types.ModuleType("datasets")
    datasets.Dataset = FakeDataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verifiers", verifiers)
    monkeypatch.setitem(sys.modules, "datasets", datasets)


def install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: JobSpec, module_source: str, rows: list[dict], plugin_graders: dict[str, bytes] | None = None
):  # type: ignore[no-untyped-def]
    dataset = "".join(json.dumps(row) + "\n" for row in rows).encode()
    bundle = build_bundle(spec, module_source.encode(), dataset, plugin_graders=plugin_graders)
    write_bundle(bundle, str(tmp_path / "bundle"))
    monkeypatch.syspath_prepend(str(tmp_path / "bundle" / "env"))
    name = bundle.manifest.env_module
    for loaded in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, graders.GRADERS_MODULE, sys.modules.get(graders.GRADERS_MODULE))  # the package sets it: undone after the test
    for plugin in plugin_graders or {}:
        alias = graders.plugin_module_name(plugin)
        monkeypatch.setitem(sys.modules, alias, sys.modules.get(alias))  # the package sets these too
    return importlib.import_module(name)


def chat(role: str, text: str) -> list[dict]:
    return [{"role": role, "content": text}]


ITEMS = [{"prompt": "add 2+3=", "answer": "5"}, {"prompt": "add 10+4=", "answer": "14"}]


def test_local_agent_environment_becomes_a_weighted_rubric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    weights = {"correctness": 1.0, "format": 0.5, "length_penalty": -1.0}
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "reward": {"components": weights}, "dataset": {"size": 2}})
    package = install(tmp_path, monkeypatch, spec, environment_source(weights), ITEMS)
    env = package.load_environment()
    assert env.dataset.rows == [{"question": "add 2+3=", "answer": "5"}, {"question": "add 10+4=", "answer": "14"}]
    assert env.system_prompt is None
    names = [f.__name__ for f in env.rubric.funcs]
    assert names == ["correctness", "format", "length_penalty", "reward"]
    assert env.rubric.weights == [1.0, 0.5, -1.0, 0.0]
    scores = {f.__name__: f(prompt=chat("user", "add 2+3="), completion=chat("assistant", "5"), answer="5", state={}, info={}) for f in env.rubric.funcs}
    length_penalty = -(len("5") + 1) / DEFAULT_MAX_TOKENS
    assert scores == {"correctness": 1.0, "format": 1.0, "length_penalty": length_penalty, "reward": 1.0 + 0.5 + length_penalty}
    wrong = env.rubric.funcs[0](prompt=chat("user", "add 2+3="), completion=chat("assistant", "7"), answer="5")
    assert wrong == 0.0


def test_module_without_components_uses_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    source = "def reward(prompt, completion, answer):\n    return 1.0 if completion.strip() == answer else len(prompt) * 0.0\n"
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}})
    package = install(tmp_path, monkeypatch, spec, source, ITEMS)
    env = package.load_environment(system_prompt="Answer with the number only.")
    assert [f.__name__ for f in env.rubric.funcs] == ["reward"] and env.rubric.weights == [1.0]
    assert env.system_prompt == "Answer with the number only."
    think = chat("assistant", "<think>\nadding\n</think>\n\n14")
    assert env.rubric.funcs[0](chat("user", "add 10+4="), think, "14") == 1.0


def test_missing_component_fails_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    source = "def reward(p, c, a):\n    return 0.0\nCOMPONENTS = {'exact': reward}\n"
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "reward": {"components": {"correctness": 1.0}}})
    package = install(tmp_path, monkeypatch, spec, source, ITEMS)
    with pytest.raises(ValueError, match="correctness"):
        package.load_environment()


def test_text_extraction_and_safe_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}})
    package = install(tmp_path, monkeypatch, spec, "def reward(p, c, a):\n    return 1.0\n", ITEMS)
    assert package.completion_text("plain") == "plain"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "4"}]}]
    assert package.completion_text(parts) == "14"
    message = types.SimpleNamespace(role="assistant", content="<think></think>42")
    assert package.completion_text([{"role": "user", "content": "q"}, message]) == "42"
    assert package.prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": "add 1+1="}]) == "add 1+1="
    assert package.completion_text([]) == ""

    def boom(p: str, c: str, a: str) -> float:
        raise ZeroDivisionError

    assert package.safe_score(boom, "p", "c", "a") == 0.0
    assert package.safe_score(lambda p, c, a: math.nan, "p", "c", "a") == 0.0
    assert package.safe_score(lambda p, c, a: True, "p", "c", "a") == 0.0
    assert package.safe_score(lambda p, c, a: 2, "p", "c", "a") == 2.0
    assert package.read_items('\n{"prompt": "a", "answer": "b"}\n\n') == [{"question": "a", "answer": "b"}]


def test_compile_bundle_reads_the_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "files"
    workspace.mkdir()
    (workspace / "reward_mod.py").write_text("def reward(p, c, a):\n    return 1.0\n")
    (workspace / "data.jsonl").write_text(json.dumps(ITEMS[0]) + "\n")
    spec = JobSpec.model_validate(
        {"model": {"name": "Qwen/Qwen3-0.6B"}, "environment": {"module": "reward_mod.py"}, "dataset": {"path": "data.jsonl", "size": 1}}
    )
    bundle = compile_bundle(spec, workspace)
    module = bundle.manifest.env_module
    assert bundle.files[f"env/{module}/agent_environment.py"] == (workspace / "reward_mod.py").read_bytes()
    assert bundle.files[f"env/{module}/dataset.jsonl"] == (workspace / "data.jsonl").read_bytes()
    pyproject = bundle.files["env/pyproject.toml"].decode()
    assert f'packages = ["{module}"]' in pyproject and "dataset.jsonl" in pyproject and "dependencies = []" in pyproject


def test_the_package_ships_metarl_graders_for_the_agents_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    source = "import metarl_graders\n\n\ndef reward(prompt, completion, answer):\n    return metarl_graders.grade('addition', answer, completion)\n"
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 2}})
    bundle = build_bundle(spec, source.encode(), b"".join(json.dumps(row).encode() + b"\n" for row in ITEMS))
    shipped = f"env/{bundle.manifest.env_module}/metarl_graders.py"
    assert bundle.files[shipped] == Path(graders.__file__).read_bytes()  # the file itself, not a copy of its functions
    assert bundle.manifest.files[shipped] == sha256_hex(bundle.files[shipped])
    package = install(tmp_path, monkeypatch, spec, source, ITEMS)
    assert Path(sys.modules["metarl_graders"].__file__).parent == Path(package.__file__).parent
    [score] = package.load_environment().rubric.funcs
    assert score(prompt=chat("user", "add 20+22="), completion=chat("assistant", "42"), answer="42") == 1.0
    assert score(prompt=chat("user", "add 20+22="), completion=chat("assistant", "32"), answer="42") == 0.25  # right-aligned partial credit


def test_the_package_name_follows_the_graders(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 2}})
    before = build_bundle(spec, b"def reward(p, c, a):\n    return 1.0\n", b"{}\n").manifest.env_module
    monkeypatch.setattr(compiler, "graders_source", lambda: Path(graders.__file__).read_bytes() + b"\n# changed\n")
    assert build_bundle(spec, b"def reward(p, c, a):\n    return 1.0\n", b"{}\n").manifest.env_module != before  # a pod never reuses stale graders
