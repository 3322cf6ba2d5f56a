"""The task families' graders, defined once (metarl/graders.py): stdlib only, the families grade with them,
and the sandbox and the pod's environment package import that same file as ``metarl_graders``."""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from pathlib import Path

import pytest

from metarl import graders, sandbox_runner
from metarl.backends.local import train as local_train
from metarl.learning.grpo import RewardComponentWeights
from metarl.learning.registry import FAMILIES
from metarl.learning.tokenizer import CHARACTERS
from metarl.policy import job_language
from metarl.sandbox import isolation

GRADERS_FILE = Path(graders.__file__)
ENV_TEMPLATE = Path(__file__).resolve().parents[2] / "metarl" / "backends" / "runpod" / "primerl" / "env_template.py"


def test_the_graders_import_only_the_standard_library() -> None:
    tree = ast.parse(GRADERS_FILE.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {
        "__future__",
        "re",
        "math",
        "sys",
        "functools",
        "typing",
        "collections.abc",
        "importlib",
        "importlib.metadata",
        "re2",
    }  # importlib: plugins, in metarl only
    # re2 (google-re2) only where it can be imported: without it the graders match with their own linear-time engine
    guarded = [
        node for node in ast.walk(tree) if isinstance(node, ast.Try) and any(isinstance(item, ast.Import) and item.names[0].name == "re2" for item in node.body)
    ]
    assert guarded and any(isinstance(handler.type, ast.Name) and handler.type.id == "ImportError" for handler in guarded[0].handlers)
    # and the file runs on a bare interpreter: no site-packages, no metarl (as in the sandbox and in the pod's package)
    code = f"ns = {{}}; exec(compile(open({str(GRADERS_FILE)!r}).read(), 'g', 'exec'), ns); print(ns['grade']('addition', '42', '32'))"
    run = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "0.25", run.stderr


def test_every_copy_of_the_import_name_agrees() -> None:
    """The sandbox runner and the pod's package __init__ import no metarl, so each names the module itself."""
    assert sandbox_runner.GRADERS_MODULE == graders.GRADERS_MODULE and graders.GRADERS_MODULE in sandbox_runner.ALLOWED_MODULES
    assert isolation.SANDBOX_GRADERS == f"/sandbox/{graders.GRADERS_MODULE}.py"
    template = ast.parse(ENV_TEMPLATE.read_text(encoding="utf-8"))
    assigned = {
        node.targets[0].id: node.value.value
        for node in template.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
    }
    assert assigned["GRADERS_MODULE"] == graders.GRADERS_MODULE
    assert sandbox_runner.PLUGIN_MODULE_PREFIX == assigned["PLUGIN_MODULE_PREFIX"] == graders.PLUGIN_MODULE_PREFIX
    assert isolation.sandbox_plugin_path("spelled_count") == f"/sandbox/{graders.PLUGIN_MODULE_PREFIX}spelled_count.py"


def test_every_family_is_known_to_the_graders() -> None:
    assert set(graders.MAX_ANSWER_CHARS) == set(FAMILIES)
    assert graders.RIGHT_ALIGNED_FAMILIES <= set(FAMILIES)
    for name, family in FAMILIES.items():
        assert family.max_answer_chars == graders.MAX_ANSWER_CHARS[name]


@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_the_reward_components_are_the_families_graders(family_name: str) -> None:
    family = FAMILIES[family_name]
    components = graders.reward_components(family_name, 12)
    assert tuple(components) == graders.REWARD_COMPONENTS
    rng = random.Random(family_name)
    for _ in range(300):
        example = family.generate(rng, rng.random())
        text = rng.choice([example.answer, f" {example.answer} ", example.answer[:-1], "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(12)))])
        args = (example.prompt, text, example.answer)
        assert components["correctness"](*args) == family.grade(example, text)
        assert components["exact"](*args) == float(family.is_exact(example, text))
        assert components["format"](*args) == float(family.is_well_formed(text))
        assert components["length_penalty"](*args) == -min(1.0, (len(text) + 1) / 12)


def test_format_checks_and_partial_credit() -> None:
    assert graders.is_well_formed("addition", " 123 ") and not graders.is_well_formed("addition", "1234")
    assert graders.is_well_formed("max_of_list", "81") and not graders.is_well_formed("max_of_list", "8")
    assert graders.is_well_formed("date_format", "23 apr 1987") and not graders.is_well_formed("date_format", "23 april 1987")
    assert graders.is_well_formed("caesar", "abcd") and not graders.is_well_formed("caesar", "ab1")
    assert graders.is_well_formed("unknown-family", "x" * 100) and not graders.is_well_formed("unknown-family", "")
    assert graders.grade("addition", "42", "32") == 0.25  # numbers compare from the right
    assert graders.grade("reversal", "abcd", "abxd") == 0.375
    assert graders.grade("sorting", "1134", " 1134\n") == 1.0


def test_one_list_of_reward_components() -> None:
    """The job language, the local trainer and its weights name the graders' components, in the same order."""
    assert job_language.REWARD_COMPONENTS is graders.REWARD_COMPONENTS
    assert local_train.REWARD_COMPONENTS is graders.REWARD_COMPONENTS
    assert tuple(RewardComponentWeights.model_fields) == graders.REWARD_COMPONENTS
