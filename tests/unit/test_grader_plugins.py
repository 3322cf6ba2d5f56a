"""Plugin graders (metarl/learning/grader_plugins.py; kind "plugin" of metarl/graders.py and schemas/graders.py):
registration checks, spec checks (`metarl tasks check`), and one implementation grading in metarl, in a
fresh subprocess, in the sandbox and in a compiled Runpod environment package. The plugin is the fixture
package's `spelled_count` (tests/fixtures/families/plugin_site/metarl_vowels/grader.py): a count as
digits or as an English word, partial credit when off by one, which no built-in grader kind expresses."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from metarl import graders
from metarl.backends.local.agent import environment_source
from metarl.backends.runpod.pod.manifest import sha256_hex
from metarl.backends.runpod.primerl.compiler import build_bundle
from metarl.learning import grader_plugins, registry
from metarl.learning.grader_plugins import GraderPluginError
from metarl.runconfig import load_task_spec
from metarl.sandbox import isolation
from metarl.sandbox.parent import SandboxCall, SandboxLimits, SandboxSession, run_in_sandbox
from metarl_cli.tasks_command import check_folder, cmd_check
from schemas.base import ConfigError
from schemas.graders import GraderSpec
from schemas.job import JobSpec
from tests.unit.test_isolation import ROOT, pairs
from tests.unit.test_primerl_package import chat, fake_vf, install  # noqa: F401 (fixture)
from tests.unit.test_sandbox import BASE_LIMITS, without_bubblewrap, workspace_with  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "families"
PLUGIN_SITE = FIXTURES / "plugin_site"
PLUGIN_FILE = (PLUGIN_SITE / "metarl_vowels" / "grader.py").resolve()
SPELLED: dict[str, Any] = {"kind": "plugin", "plugin": "spelled_count", "options": {"near_credit": 0.25}}
ALIAS = graders.plugin_module_name("spelled_count")
SPEC: TypeAdapter[Any] = TypeAdapter(GraderSpec)

GOOD_GRADER = """
import re


def grade(answer, completion, options):
    return 1.0 if completion.strip() == answer else 0.0


def is_exact(answer, completion, options):
    return completion.strip() == answer


def is_well_formed(completion, options):
    return re.fullmatch(r"\\w+", completion.strip()) is not None
"""


@pytest.fixture
def fresh_graders() -> Iterator[None]:
    """No plugin grader loaded before the test, and none left after it."""
    registry.refresh_registry()
    yield
    registry.refresh_registry()


def plugin_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> str:
    """A package of a fresh name holding ``files`` (paths relative to it), importable; its name."""
    package = f"plug_{uuid.uuid4().hex[:12]}"
    for relative, text in {"__init__.py": "", **files}.items():
        path = tmp_path / "site" / package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return package


def test_the_fixture_plugin_registers_and_grades_in_metarl(plugin_installed: None) -> None:
    plugin = grader_plugins.registered_graders()["spelled_count"]
    assert (plugin.module, plugin.distribution, plugin.path) == ("metarl_vowels.grader", "metarl-vowels", PLUGIN_FILE)
    assert sys.modules[ALIAS] is sys.modules["metarl_vowels.grader"]  # imported once, aliased
    assert graders.grade(SPELLED, "3", "three") == 1.0 and graders.grade(SPELLED, "3", " 4 ") == 0.25 and graders.grade(SPELLED, "3", "5") == 0.0
    assert graders.is_exact("3", "Three", SPELLED) and not graders.is_exact("3", "4", SPELLED)
    assert graders.is_well_formed(SPELLED, "seven") and not graders.is_well_formed(SPELLED, "many")
    components = graders.reward_components("vowel_count", 8, SPELLED)
    assert [components[name]("vowels banana>", "three", "3") for name in graders.REWARD_COMPONENTS] == [1.0, 1.0, 1.0, -0.75]
    assert graders.grade({"kind": "right_aligned_digits", "charset": "digits", "max_chars": 1}, "3", "three") == 0.0  # what the built-in could not do


def test_a_process_without_the_registry_imports_the_plugin_through_its_entry_point(
    plugin_installed: None, fresh_graders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graders used before (or without) the registry, as in the trainer's and the scorers' subprocesses."""
    assert ALIAS not in sys.modules
    assert graders.grade(SPELLED, "2", "two") == 1.0
    assert Path(sys.modules[ALIAS].__file__).resolve() == PLUGIN_FILE
    with pytest.raises(graders.PluginGraderError, match="no plugin grader 'elsewhere' is installed"):
        graders.grade(dict(SPELLED, plugin="elsewhere"), "2", "two")
    monkeypatch.setattr(graders, "IMPORT_PLUGINS", False)
    with pytest.raises(graders.PluginGraderError, match="plugin grader 'elsewhere' is not loaded here"):
        graders.grade(dict(SPELLED, plugin="elsewhere"), "2", "two")


def test_a_subprocess_grades_with_the_plugin_found_on_its_path() -> None:
    """The local trainer's job and the vLLM scorer run in subprocesses that inherit the environment (PYTHONPATH)."""
    code = (
        "from metarl.learning.data_families import GradingFamily\n"
        "from metarl.learning.families import Example\n"
        f"family = GradingFamily('vowel_count', {SPELLED!r}, 1)\n"
        "item = Example(prompt='vowels banana>', answer='3')\n"
        "print(family.grade(item, 'three'), family.grade(item, 'two'), family.is_exact(item, '3'), family.is_well_formed('lots'))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGIN_SITE), str(REPO)]))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stdout.split() == ["1.0", "0.25", "True", "False"], run.stderr[-2000:]


@pytest.mark.parametrize("value", [1.7, -0.1, math.nan, math.inf, True, "1", None])
def test_a_plugin_score_outside_0_to_1_is_an_error_not_a_reward(monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    bad = types.ModuleType(graders.plugin_module_name("bad"))
    bad.grade = lambda answer, completion, options: value  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, bad.__name__, bad)
    grader = {"kind": "plugin", "plugin": "bad", "options": {}}
    with pytest.raises(graders.PluginGraderError, match=r"plugin grader 'bad': grade returned .*; it must return a finite number in \[0, 1\]"):
        graders.grade(grader, "a", "b")
    with pytest.raises(graders.PluginGraderError):
        graders.reward_components("x", 8, grader)["correctness"]("p", "b", "a")


def test_plugin_verdicts_must_be_bools_and_scores_at_the_bounds_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = types.ModuleType(graders.plugin_module_name("odd"))
    odd.grade = lambda answer, completion, options: 1 if completion == answer else 0  # type: ignore[attr-defined]
    odd.is_exact = lambda answer, completion, options: 1  # type: ignore[attr-defined]
    odd.is_well_formed = lambda completion, options: "yes"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, odd.__name__, odd)
    grader = {"kind": "plugin", "plugin": "odd", "options": {}}
    assert graders.grade(grader, "a", "a") == 1.0 and graders.grade(grader, "a", "b") == 0.0
    with pytest.raises(graders.PluginGraderError, match="is_exact returned 1; it must return True or False"):
        graders.is_exact("a", "a", grader)
    with pytest.raises(graders.PluginGraderError, match="is_well_formed returned 'yes'"):
        graders.is_well_formed(grader, "a")


def test_a_plugin_importing_numpy_or_metarl_is_refused_with_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_graders: None) -> None:
    package = plugin_package(
        tmp_path,
        monkeypatch,
        {"numeric.py": "import numpy\n" + GOOD_GRADER, "inside.py": "import re\nfrom metarl.graders import grade as builtin\n" + GOOD_GRADER},
    )
    with pytest.raises(GraderPluginError) as refused:
        grader_plugins.build_grader_registry([("numeric", f"{package}.numeric", "numeric-grader")])
    path = (tmp_path / "site" / package / "numeric.py").resolve()
    message = refused.value.message
    assert f"plugin grader 'numeric' (entry point numeric = '{package}.numeric' of numeric-grader, group 'metarl.graders')" in message
    assert f"{path} line 1: imports numpy, which is not in the standard library" in message
    assert "imports only these standard modules" in refused.value.fix and "grade(answer, completion, options)" in refused.value.fix
    assert f"{package}.numeric" not in sys.modules and graders.plugin_module_name("numeric") not in sys.modules  # checked, never run
    with pytest.raises(GraderPluginError, match=r"inside\.py line 2: imports metarl\.graders: a plugin grader must not import metarl"):
        grader_plugins.build_grader_registry([("inside", f"{package}.inside", "inside-grader")])


@pytest.mark.parametrize(
    ("files", "module", "expected"),
    [
        ({"folder/__init__.py": GOOD_GRADER}, "{p}.folder", "is a package"),
        ({"rel.py": "from . import helper\n" + GOOD_GRADER, "helper.py": ""}, "{p}.rel", "rel.py line 1: has a relative import"),
        (
            {"lazy.py": GOOD_GRADER + "\n\ndef helper():\n    import xml.dom\n"},
            "{p}.lazy",
            "imports xml.dom, a standard-library module the sandbox does not load",
        ),
        ({"sneaky.py": GOOD_GRADER + "\nos = __import__('os')\n"}, "{p}.sneaky", "calls __import__"),
        (
            {"partial.py": "def grade(answer, completion, options):\n    return 0.0\n"},
            "{p}.partial",
            "defines no top-level function is_exact(answer, completion, options)",
        ),
        (
            {"arity.py": GOOD_GRADER.replace("def grade(answer, completion, options)", "def grade(answer, completion)")},
            "{p}.arity",
            "grade takes (answer, completion); define grade(answer, completion, options)",
        ),
        ({"broken.py": "def grade(:\n"}, "{p}.broken", "broken.py line 1: is not valid Python"),
        ({"attr.py": GOOD_GRADER}, "{p}.attr:grade", "names an attribute"),
        ({}, "{p}.missing", "its module cannot be found"),
    ],
)
def test_plugins_that_could_not_run_in_the_sandbox_or_on_the_pod_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_graders: None, files: dict[str, str], module: str, expected: str
) -> None:
    package = plugin_package(tmp_path, monkeypatch, files)
    with pytest.raises(GraderPluginError, match=re.escape(expected)):
        grader_plugins.build_grader_registry([("shaped", module.format(p=package), "shaped-grader")])


def test_a_plugin_name_registered_twice_or_unusable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_graders: None) -> None:
    package = plugin_package(tmp_path, monkeypatch, {"one.py": GOOD_GRADER, "two.py": GOOD_GRADER})
    with pytest.raises(GraderPluginError, match=r"'same' is registered by both dist-a \(.*\) and dist-b"):
        grader_plugins.build_grader_registry([("same", f"{package}.one", "dist-a"), ("same", f"{package}.two", "dist-b")])
    with pytest.raises(GraderPluginError, match="the name is not usable"):
        grader_plugins.build_grader_registry([("Same-Name", f"{package}.one", "dist-a")])
    plugins = grader_plugins.build_grader_registry([("same", f"{package}.one", "dist-a")])
    assert sys.modules[graders.plugin_module_name("same")] is sys.modules[f"{package}.one"] and plugins["same"].path.name == "one.py"


def test_a_family_whose_grader_names_an_unregistered_plugin_is_not_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_graders: None) -> None:
    family = (
        "from metarl.learning.families import Example, TaskFamily\n\n\n"
        "class Words(TaskFamily):\n"
        "    name = 'words'\n"
        "    description = 'Say hello.'\n"
        "    max_answer_chars = 5\n"
        "    grader = {'kind': 'plugin', 'plugin': 'not_installed', 'options': {}}\n\n"
        "    def sample_item(self, rng, difficulty):\n"
        "        return Example(prompt='say>', answer='hello')\n\n"
        "    def item_key(self, prompt):\n"
        "        return prompt\n"
    )
    package = plugin_package(tmp_path, monkeypatch, {"words.py": family})
    with pytest.raises(registry.FamilyRegistryError, match="family 'words' .* unusable grader: grader.plugin: no plugin grader 'not_installed' is registered"):
        registry.load_reference("words", f"{package}.words:Words", "words-dist")


def capitals_with_grader(tmp_path: Path, grader_table: str) -> Path:
    """A copy of the capitals fixture (tests/fixtures/families/capitals) whose [grader] is ``grader_table``."""
    folder = tmp_path / "specs"
    shutil.copytree(FIXTURES / "capitals", folder)
    spec = folder / "capitals.toml"
    text = spec.read_text()
    spec.write_text(text[: text.index("[grader]")] + grader_table)
    return folder


def test_tasks_check_names_an_unregistered_plugin_grader(tmp_path: Path, fresh_graders: None, capsys: pytest.CaptureFixture[str]) -> None:
    folder = capitals_with_grader(tmp_path, '[grader]\nkind = "plugin"\nplugin = "no_such_grader"\n')
    valid, errors = check_folder(folder)
    assert valid == [] and [problem.field for problem in errors[0].problems] == ["grader.plugin"]
    problem = errors[0].problems[0]
    assert problem.message == "no plugin grader 'no_such_grader' is registered" and "entry-point group 'metarl.graders'" in problem.fix
    assert cmd_check(folder) == 2
    assert "grader.plugin: no plugin grader 'no_such_grader' is registered" in capsys.readouterr().err


def test_options_the_plugin_refuses_are_named(tmp_path: Path, plugin_installed: None) -> None:
    folder = capitals_with_grader(tmp_path, '[grader]\nkind = "plugin"\nplugin = "spelled_count"\noptions = { near_credit = 2, colour = "red" }\n')
    with pytest.raises(ConfigError) as refused:
        load_task_spec(folder / "capitals.toml")
    assert [(problem.field, problem.message) for problem in refused.value.problems] == [
        ("grader.options", "unknown option 'colour' (options: words, near_credit)"),
        ("grader.options", "near_credit must be a number in [0, 1], not 2"),
    ]
    assert all(str(PLUGIN_FILE) in problem.fix for problem in refused.value.problems)


def test_a_broken_installed_plugin_is_one_error_of_tasks_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_graders: None) -> None:
    package = plugin_package(tmp_path, monkeypatch, {"numeric.py": "import numpy\n" + GOOD_GRADER})
    monkeypatch.setattr(grader_plugins, "plugin_entries", lambda: [("numeric", f"{package}.numeric", "numeric-grader")])
    valid, errors = check_folder(FIXTURES / "capitals")
    assert valid == [] and len(errors) == 1 and errors[0].problems[0].field == "(entry points)"
    assert "imports numpy, which is not in the standard library" in errors[0].problems[0].message


def test_the_plugin_table_is_bounded() -> None:
    assert SPEC.validate_python({"kind": "plugin", "plugin": "spelled_count"}).model_dump() == {"kind": "plugin", "plugin": "spelled_count", "options": {}}
    options = {"words": False, "near_credit": 0.5, "count": 3, "name": "x", "list": [1, "a", 2.5, True]}
    assert SPEC.validate_python({"kind": "plugin", "plugin": "p2", "options": options}).model_dump()["options"] == options
    for bad in (
        {"plugin": "Spelled"},
        {"plugin": "x" * 41},
        {"plugin": "ok", "extra": 1},
        {"plugin": "ok", "options": {"nested": {"a": 1}}},
        {"plugin": "ok", "options": {"none": None}},
        {"plugin": "ok", "options": {"n": math.nan}},
        {"plugin": "ok", "options": {"bad key": 1}},
        {"plugin": "ok", "options": {"long": "x" * 201}},
        {"plugin": "ok", "options": {"many": list(range(65))}},
        {"plugin": "ok", "options": {f"o{index}": index for index in range(33)}},
        {"plugin": "ok", "options": {f"o{index}": ["x" * 200] * 2 for index in range(30)}},  # over the size bound
    ):
        with pytest.raises(ValidationError):
            SPEC.validate_python({"kind": "plugin", **bad})


def test_the_sandbox_binds_each_plugin_grader_read_only_next_to_the_graders() -> None:
    argv = isolation.runner_argv(ROOT, ("--serve",))
    command = isolation.bwrap_command(
        "/b/bwrap",
        ROOT,
        runner="/repo/runner.py",
        graders="/repo/graders.py",
        plugin_graders={"spelled_count": "/site/pkg/grader.py"},
        workspace="/w/files",
        as_root=False,
        seccomp_fd=7,
        argv=argv,
    )
    binds = pairs(command, "--ro-bind")
    assert ("/site/pkg/grader.py", "/sandbox/metarl_grader_spelled_count.py") in binds and ("/repo/graders.py", "/sandbox/metarl_graders.py") in binds
    assert "--bind" not in command  # nothing of the host is writable


PLUGIN_PROBE = (
    "import metarl_graders\n"
    f"GRADER = {SPELLED!r}\n"
    "def reward(p, c, a):\n"
    "    return [metarl_graders.grade(GRADER, a, c), metarl_graders.is_exact(a, c, GRADER), metarl_graders.is_well_formed(GRADER, c),\n"
    "            metarl_graders.plugin_module('spelled_count').__file__]\n"
    "def other(p, c, a):\n"
    "    return metarl_graders.grade(dict(GRADER, plugin='elsewhere'), a, c)\n"
    "def overwrite(p, c, a):\n"
    "    with open(metarl_graders.plugin_module('spelled_count').__file__, 'w') as handle:\n"
    "        handle.write('def grade(answer, completion, options):\\n    return 1.0\\n')\n"
    "    return 1.0\n"
)


def sandbox_grades_with_the_plugin(tmp_path: Path, limits: SandboxLimits) -> str | None:
    """A reward session on a workspace whose environment grades through metarl_graders with the plugin; the run's level."""
    before = PLUGIN_FILE.read_bytes()
    files = workspace_with(tmp_path, "env.py", PLUGIN_PROBE)
    with SandboxSession(files, "env.py", limits) as session:
        started = session.start()
        assert started.ok, started.error
        batch = session.call([SandboxCall(function="reward", args=["vowels banana>", completion, "3"]) for completion in ("three", " 4", "7", "many")])
    assert batch.ok, batch.error
    where = isolation.sandbox_plugin_path("spelled_count") if session.level == "full" else str(PLUGIN_FILE)
    assert [call.value for call in batch.calls] == [[1.0, True, True, where], [0.25, False, True, where], [0.0, False, True, where], [0.0, False, False, where]]
    other = run_in_sandbox(files, "env.py", "other", ["p", "three", "3"], limits)
    assert other.error is not None and other.error.kind == "crash" and "plugin grader 'elsewhere' is not loaded here" in other.error.message
    refused = run_in_sandbox(files, "env.py", "overwrite", ["p", "c", "a"], limits)
    assert refused.error is not None and refused.error.kind == "forbidden"
    assert PLUGIN_FILE.read_bytes() == before
    return session.level


def test_the_sandbox_grades_with_the_plugin(tmp_path: Path, plugin_installed: None) -> None:
    assert sandbox_grades_with_the_plugin(tmp_path, SandboxLimits(**BASE_LIMITS)) == "full"


def test_the_sandbox_grades_with_the_plugin_without_bubblewrap(tmp_path: Path, plugin_installed: None, without_bubblewrap: None) -> None:
    assert sandbox_grades_with_the_plugin(tmp_path, SandboxLimits(**BASE_LIMITS, min_isolation="process")) == "process"


def test_a_compiled_bundle_ships_the_plugin_and_grades_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None, plugin_installed: None) -> None:
    sources = grader_plugins.grader_sources(SPELLED)
    assert sources == {"spelled_count": PLUGIN_FILE.read_bytes()}
    weights = {"correctness": 1.0, "exact": 0.5, "format": 0.25}
    job = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "reward": {"components": weights}, "dataset": {"size": 2}})
    module_source = environment_source(weights, "vowel_count", 16, SPELLED)
    rows = [{"prompt": "vowels banana>", "answer": "3"}, {"prompt": "vowels kiwi>", "answer": "2"}]
    dataset = b"".join(f'{{"prompt": "{row["prompt"]}", "answer": "{row["answer"]}"}}\n'.encode() for row in rows)
    bundle = build_bundle(job, module_source.encode(), dataset, plugin_graders=sources)
    shipped = f"env/{bundle.manifest.env_module}/metarl_grader_spelled_count.py"
    assert bundle.files[shipped] == PLUGIN_FILE.read_bytes() and bundle.manifest.files[shipped] == sha256_hex(bundle.files[shipped])
    assert build_bundle(job, module_source.encode(), dataset).manifest.env_module != bundle.manifest.env_module
    edited = {"spelled_count": sources["spelled_count"] + b"\n# changed\n"}
    assert build_bundle(job, module_source.encode(), dataset, plugin_graders=edited).manifest.env_module != bundle.manifest.env_module

    # the pod has no metarl and no fixture package: only the bundle's files
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry != str(PLUGIN_SITE)])
    registry.refresh_registry()
    for name in [name for name in sys.modules if name == "metarl_vowels" or name.startswith("metarl_vowels.")]:
        monkeypatch.delitem(sys.modules, name)
    package = install(tmp_path, monkeypatch, job, module_source, rows, plugin_graders=sources)
    assert Path(sys.modules[ALIAS].__file__).parent == Path(package.__file__).parent
    assert sys.modules[graders.GRADERS_MODULE].IMPORT_PLUGINS is False
    correctness, exact, well_formed = package.load_environment().rubric.funcs[:3]
    for completion, expected in (("three", (1.0, 1.0, 1.0)), (" 4", (0.25, 0.0, 1.0)), ("seven", (0.0, 0.0, 1.0)), ("lots", (0.0, 0.0, 0.0))):
        scored = tuple(
            score(prompt=chat("user", "vowels banana>"), completion=chat("assistant", completion), answer="3") for score in (correctness, exact, well_formed)
        )
        assert scored == expected, completion
