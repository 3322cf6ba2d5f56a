"""The job compiler against the pinned prime-rl: the JSON schema derived from its own classes, its
cross-field rules, and what the compiled rl.toml must hold for a GPU job to keep its weights.

Upstream facts are from prime-rl v0.8.0 (commit 60bc2954), paths relative to its src/prime_rl/ or
packages/prime-rl-configs/src/prime_rl/. ``scripts/check_bundles_with_primerl.py`` runs the tag's own
launcher on the same bundles (docs/runpod.md, "Checking compiled configs against prime-rl").
"""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from metarl.backends.local.train import compile_local_job
from metarl.backends.runpod.pod.pin import PRIME_RL_COMMIT, PRIME_RL_TAG, VERIFIERS_COMMIT
from metarl.backends.runpod.primerl.checks import primerl_compile_problems
from metarl.backends.runpod.primerl.compiler import (
    LORA_ALPHA,
    MODEL_RENDERERS,
    POST_BATCH_FILTERS,
    PROBE_ENV_ID,
    CompileOptions,
    build_bundle,
    ckpt_interval,
    compile_rl_config,
    pod_compile_options,
    render_rl_toml,
    seq_len_for,
)
from metarl.backends.runpod.primerl.schema import SCHEMA_FILE, rl_config_problems, rl_schema, schema_provenance
from metarl.backends.runpod.primerl.variants import checked_jobs, compiled, expected_resolved
from metarl.backends.sim.simulator import _valid_job
from metarl.domain.sequence import compiled_seq_len
from metarl.policy import job_language as jl
from metarl.probe.job import probe_job_text
from schemas.base import load_toml_model
from schemas.job import CPU_TRAIN_DEFAULTS, PRIME_RL_TRAIN_DEFAULTS, JobSpec, JobTraining
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASKS = [load_toml_model(TaskSpec, path) for path in sorted((REPO / "tasks_specs").glob("*.toml"))]


def job(**sections: object) -> JobSpec:
    return JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, **sections})


def compiled_toml(spec: JobSpec, options: CompileOptions | None = None) -> dict:
    return tomllib.loads(render_rl_toml(compile_rl_config(spec, PROBE_ENV_ID, options)))


# ---------------------------------------------------------------------------------------------
# the derived schema


def test_the_schema_is_derived_from_the_pinned_tag() -> None:
    provenance = schema_provenance()
    assert SCHEMA_FILE.name == f"rl_config_{PRIME_RL_TAG}.schema.json"
    assert (provenance["prime_rl_tag"], provenance["prime_rl_commit"]) == (PRIME_RL_TAG, PRIME_RL_COMMIT)
    assert provenance["packages"]["verifiers"] == "0.2.2.dev76" and VERIFIERS_COMMIT[:9] in provenance["submodule_releases"]["verifiers"]
    assert provenance["generated_by"].startswith("scripts/derive_primerl_schema.py")
    schema = rl_schema()
    assert schema["title"] == "RLConfig" and schema["required"] == ["trainer", "orchestrator"]
    assert schema["additionalProperties"] is False  # pydantic_config.BaseConfig forbids extra keys


def test_the_schema_holds_the_upstream_facts_the_compiler_relies_on() -> None:
    defs = rl_schema()["$defs"]
    trainer_ckpt = defs["prime_rl__configs__trainer__CheckpointConfig"]["properties"]
    assert {"interval", "keep_last", "weights_only", "weights"} <= set(trainer_ckpt)
    assert "save_adapter_separately" in defs["WeightCheckpointConfig"]["properties"]
    assert defs["DefaultLossConfig"]["properties"]["kl_tau"]["default"] == 1e-3
    filters = defs["OrchestratorConfig"]["properties"]["post_batch_filters"]["default"]
    assert [(item["type"], item["enforce"]) for item in filters] == [("gibberish", False), ("repetition", False), ("zero_advantage", True)]
    assert defs["SingleNodeDeploymentConfig"]["properties"]["gpus_per_node"]["default"] == 8


# ---------------------------------------------------------------------------------------------
# the compiled config


def test_defaults_compile_to_the_expected_rl_toml() -> None:
    config = compiled_toml(job())
    assert rl_config_problems(config) == []
    assert config["max_steps"] == 40 and config["model"] == {"name": "Qwen/Qwen3-0.6B"}
    assert config["deployment"] == {"type": "single_node", "gpus_per_node": 2, "num_train_gpus": 1, "num_infer_gpus": 1}
    assert config["orchestrator"]["batch_size"] == 64 and config["orchestrator"]["group_size"] == 8
    assert config["orchestrator"]["train"]["sampling"] == {"temperature": 1.0, "max_completion_tokens": 16}
    assert config["orchestrator"]["train"]["source"] == [{"name": "metarl-job", "legacy": {"id": PROBE_ENV_ID}}]
    assert config["orchestrator"]["renderer"] == {"name": "qwen3", "enable_thinking": False}
    assert config["trainer"]["optim"] == {"type": "adamw", "lr": 3e-6}
    assert config["trainer"]["loss"] == {"type": "default", "kl_tau": 1e-3}
    assert config["ckpt"] == {"interval": 10, "keep_last": 2} and config["trainer"]["ckpt"] == {"weights_only": True}
    assert config["file_monitor"] == {} and "model" not in config["trainer"]
    assert config["inference"]["model"]["max_model_len"] == config["seq_len"] == 512
    assert render_rl_toml({}).startswith(f"# Compiled by metarl for prime-rl {PRIME_RL_TAG}")


def test_every_job_setting_lands_in_its_rl_toml_key() -> None:
    spec = job(
        model={"name": "Qwen/Qwen3-1.7B", "lora_rank": 16},
        training={"learning_rate": 3e-5, "max_steps": 200, "batch_size": 96, "group_size": 12, "kl_coef": 0.05, "seed": 7},
        rollout={"temperature": 0.7, "max_tokens": 600},
    )
    config = compiled_toml(spec)
    assert rl_config_problems(config) == []
    assert config["model"]["name"] == "Qwen/Qwen3-1.7B"
    assert config["trainer"]["model"]["lora"] == {"rank": 16, "alpha": 32.0}
    assert config["trainer"]["optim"]["lr"] == 3e-5 and config["max_steps"] == 200
    assert config["orchestrator"]["batch_size"] == 96 and config["orchestrator"]["group_size"] == 12
    assert config["trainer"]["loss"] == {"type": "default", "kl_tau": 0.05}
    assert config["inference"]["seed"] == 7
    assert config["orchestrator"]["train"]["sampling"] == {"temperature": 0.7, "max_completion_tokens": 600}
    assert config["seq_len"] == 1024 == config["inference"]["model"]["max_model_len"]


def test_seq_len_covers_prompt_and_completion() -> None:
    options = CompileOptions()
    for max_tokens in (1, 16, 256, 257, 4000, 32_768):
        seq_len = seq_len_for(max_tokens, options)
        assert seq_len >= max_tokens + options.prompt_token_budget and seq_len % 256 == 0 and seq_len >= 512
        assert seq_len == compiled_seq_len(max_tokens) == compiled_toml(job(rollout={"max_tokens": max_tokens}))["seq_len"], "the probe's rule"
    assert [compiled_seq_len(n) for n in (16, 256, 257, 300, 512)] == [512, 512, 768, 768, 768]


def test_pod_options_are_respected_and_checked() -> None:
    config = compile_rl_config(job(), PROBE_ENV_ID, CompileOptions(num_train_gpus=2, num_infer_gpus=2, gpus_per_node=4, max_off_policy_steps=3))
    assert rl_config_problems(config) == []
    assert config["orchestrator"]["max_off_policy_steps"] == 3
    too_many = compile_rl_config(job(), PROBE_ENV_ID, CompileOptions(num_train_gpus=2, num_infer_gpus=2, gpus_per_node=2))
    assert [p.path for p in rl_config_problems(too_many)] == ["deployment"]


@pytest.mark.parametrize(("gpus", "train", "infer"), [(2, 1, 1), (3, 1, 2), (4, 2, 2), (8, 4, 4)])
def test_pod_gpus_split_between_trainer_and_vllm(gpus: int, train: int, infer: int) -> None:
    options = pod_compile_options(gpus)
    assert (options.gpus_per_node, options.num_train_gpus, options.num_infer_gpus) == (gpus, train, infer)
    assert rl_config_problems(compile_rl_config(job(), PROBE_ENV_ID, options)) == []


def test_a_one_gpu_pod_cannot_be_compiled_for() -> None:
    """Item 6: prime-rl needs one trainer and one inference GPU on the node (configs/rl.py validate_gpu_count)."""
    with pytest.raises(ValueError, match="one trainer and one inference GPU"):
        pod_compile_options(1)
    one = compile_rl_config(job(), PROBE_ENV_ID, CompileOptions(num_train_gpus=1, num_infer_gpus=1, gpus_per_node=1))
    assert [(p.path, p.kind) for p in rl_config_problems(one)] == [("deployment", "semantic")]


# ---------------------------------------------------------------------------------------------
# item 1: a job stopped at its time cap keeps recent weights


def saved_steps(max_steps: int, interval: int, stopped_after: int) -> list[int]:
    """Steps whose weights exist once rl has finished ``stopped_after`` steps: every multiple of the
    interval before the last step, and the last step once reached (src/prime_rl/trainer/rl/train.py)."""
    done = min(stopped_after, max_steps)
    steps = [step for step in range(interval, done + 1, interval) if step < max_steps]
    return steps + ([max_steps] if done == max_steps else [])


def test_the_compiled_config_saves_weights_every_interval_and_keeps_the_last_two() -> None:
    config = compiled_toml(job(training={"max_steps": 400}), pod_compile_options(2, max_train_seconds=600))
    assert config["ckpt"] == {"interval": 15, "keep_last": 2}  # 600 s / 10 s per step = 60 steps in the cap, 4 saves
    assert config["trainer"]["ckpt"]["weights_only"] is True  # Hugging Face weights only, no DCP state
    assert "interval" not in config["trainer"]["ckpt"]  # shared [ckpt] propagates it to trainer and orchestrator


@pytest.mark.parametrize("max_steps", [1, 2, 3, 7, 40, 100, 1000, 100_000])
@pytest.mark.parametrize("cap", [None, 1.5, 30.0, 600.0, 3600.0])
def test_a_job_stopped_at_its_cap_has_weights_within_one_interval(max_steps: int, cap: float | None) -> None:
    options = pod_compile_options(2, max_train_seconds=cap)
    interval = ckpt_interval(max_steps, options)
    assert 1 <= interval <= max_steps
    horizon = max_steps if cap is None else min(max_steps, max(1, int(cap // options.expected_step_seconds)))
    # cut at the cap with steps as fast as assumed or up to checkpoints_per_job times slower (at
    # least horizon // slowdown steps done), or stopped after its last step: weights are there
    slowdowns = (1, 2, options.checkpoints_per_job) if cap is not None else (1,)
    for slowdown in slowdowns:
        stopped_after = max(1, horizon // slowdown) if cap is not None else max_steps
        saved = saved_steps(max_steps, interval, stopped_after)
        assert saved, f"a job cut after {stopped_after} steps has no weights (interval {interval})"
        assert min(stopped_after, max_steps) - saved[-1] < interval
    # saves stay few: checkpoints_per_job over the horizon, at most twice that by rounding
    assert len(saved_steps(max_steps, interval, horizon)) <= 2 * options.checkpoints_per_job + 1


# ---------------------------------------------------------------------------------------------
# item 2: a LoRA job writes its adapter


def test_a_lora_job_saves_its_adapter_separately() -> None:
    config = compiled_toml(job(model={"name": "Qwen/Qwen3-0.6B", "lora_rank": 8}))
    assert config["trainer"]["ckpt"] == {"weights_only": True, "weights": {"save_adapter_separately": True}}
    assert config["trainer"]["model"]["lora"] == {"rank": 8, "alpha": 32.0}
    assert rl_config_problems(config) == []
    full = compiled_toml(job())
    assert "weights" not in full["trainer"]["ckpt"]
    # configs/trainer.py validate_lora_adapter_saving: the flag without LoRA is an error
    full["trainer"]["ckpt"]["weights"] = {"save_adapter_separately": True}
    assert [(p.path, p.kind) for p in rl_config_problems(full)] == [("trainer.ckpt.weights.save_adapter_separately", "semantic")]


def test_the_manifest_tells_the_pod_how_to_merge_and_where_weights_are() -> None:
    module, data = b"def reward(prompt, completion, answer):\n    return 1.0\n", b'{"prompt": "a", "answer": "b"}\n'
    lora = build_bundle(job(model={"name": "Qwen/Qwen3-1.7B", "lora_rank": 16}), module, data, pod_compile_options(2, 600)).manifest
    assert (lora.model_name, lora.lora_rank, lora.lora_alpha, lora.ckpt_interval) == ("Qwen/Qwen3-1.7B", 16, 32.0, 10)
    full = build_bundle(job(), module, data).manifest
    assert (full.model_name, full.lora_rank, full.lora_alpha) == ("Qwen/Qwen3-0.6B", 0, None)


# ---------------------------------------------------------------------------------------------
# item 3: no learning signal does not crash rl


def test_no_post_batch_filter_enforces_so_zero_advantage_batches_never_empty() -> None:
    filters = compiled_toml(job())["orchestrator"]["post_batch_filters"]
    upstream = rl_schema()["$defs"]["OrchestratorConfig"]["properties"]["post_batch_filters"]["default"]
    assert [item["type"] for item in filters] == [item["type"] for item in upstream]  # prime-rl's three filters, in its order
    assert {"type": "zero_advantage", "enforce": False} in filters
    # gibberish and repetition keep their upstream default (monitor); none drops a rollout
    assert all(item.get("enforce", next(u["enforce"] for u in upstream if u["type"] == item["type"])) is False for item in filters)
    assert POST_BATCH_FILTERS == filters


# ---------------------------------------------------------------------------------------------
# item 4: kl_coef is compiled explicitly and described as what it is


@pytest.mark.parametrize(("kl_coef", "kl_tau"), [(None, 1e-3), (0.0, 0.0), (0.05, 0.05)])
def test_kl_coef_always_compiles_to_an_explicit_kl_tau(kl_coef: float | None, kl_tau: float) -> None:
    training = {} if kl_coef is None else {"kl_coef": kl_coef}
    assert compiled_toml(job(training=training))["trainer"]["loss"] == {"type": "default", "kl_tau": kl_tau}


def test_kl_coef_is_described_per_backend_and_the_local_backend_keeps_its_kl_to_base() -> None:
    description = JobTraining.model_fields["kl_coef"].description or ""
    assert "kl_tau" in description and "inference logprob" in description and "KL to the base model" in description
    assert "k3 KL penalty to the base model" in description
    local = compile_local_job(job(), TASKS[0])["train"]
    assert local["kl_coef"] == CPU_TRAIN_DEFAULTS.kl_coef == 0.0 and local["learning_rate"] == 1e-3
    assert compile_local_job(job(training={"kl_coef": 0.05}), TASKS[0])["train"]["kl_coef"] == 0.05


# ---------------------------------------------------------------------------------------------
# item 5: GPU defaults and caps


@pytest.mark.parametrize("rank", [4, 8, 16, 64])
def test_lora_alpha_is_the_tags_default_as_in_the_configs_the_lora_rate_comes_from(rank: int) -> None:
    # configs/debug/algo/opd_lora.toml and sft_distill_lora.toml: lr 1e-4, rank 8, no alpha (LoRAConfig.alpha = 32)
    upstream_alpha = rl_schema()["$defs"]["prime_rl__configs__trainer__LoRAConfig"]["properties"]["alpha"]["default"]
    assert LORA_ALPHA == upstream_alpha == 32.0
    config = compiled_toml(job(model={"name": "Qwen/Qwen3-0.6B", "lora_rank": rank}))
    assert config["trainer"]["model"]["lora"] == {"rank": rank, "alpha": upstream_alpha}
    assert config["trainer"]["optim"]["lr"] == PRIME_RL_TRAIN_DEFAULTS.lora_learning_rate


def test_gpu_jobs_default_to_the_tags_learning_rates() -> None:
    assert (PRIME_RL_TRAIN_DEFAULTS.learning_rate, PRIME_RL_TRAIN_DEFAULTS.lora_learning_rate) == (3e-6, 1e-4)
    assert compiled_toml(job())["trainer"]["optim"]["lr"] == 3e-6
    assert compiled_toml(job(model={"name": "Qwen/Qwen3-0.6B", "lora_rank": 8}))["trainer"]["optim"]["lr"] == 1e-4
    assert compiled_toml(job(training={"learning_rate": 2e-5}))["trainer"]["optim"]["lr"] == 2e-5  # a job's own value wins
    assert job().resolved().learning_rate == 1e-3  # the CPU stand-in keeps its own


def test_shipped_tasks_cap_gpu_jobs_in_minutes_and_cpu_jobs_as_before() -> None:
    for task in TASKS:
        assert task.budget.train_seconds_for(on_gpu=False) == task.budget.max_train_seconds == 60
        assert task.budget.train_seconds_for(on_gpu=True) == task.budget.max_gpu_train_seconds == 600


# ---------------------------------------------------------------------------------------------
# item 10: every compiled bundle the checks cover validates against the derived schema


@pytest.mark.parametrize("checked", checked_jobs(TASKS), ids=lambda checked: checked.name)
def test_every_checked_bundle_validates_against_the_derived_schema(checked) -> None:  # type: ignore[no-untyped-def]
    config = compiled(checked)
    assert rl_config_problems(config) == []
    assert rl_config_problems(tomllib.loads(render_rl_toml(config))) == []
    expected = expected_resolved(config)
    assert expected["trainer:ckpt.interval"] == config["ckpt"]["interval"] <= config["max_steps"]
    assert ("trainer:ckpt.weights.save_adapter_separately" in expected) == (checked.job.model.lora_rank > 0)


def test_the_checked_bundles_cover_each_task_and_the_variants() -> None:
    names = [checked.name for checked in checked_jobs(TASKS)]
    assert names[: len(TASKS)] == [f"{task.id}-default" for task in TASKS]
    assert {"lora", "kl", "gpu4"} <= set(names)
    gpu4 = next(checked for checked in checked_jobs(TASKS) if checked.name == "gpu4")
    assert compiled(gpu4)["deployment"] == {"type": "single_node", "gpus_per_node": 4, "num_train_gpus": 2, "num_infer_gpus": 2}


# ---------------------------------------------------------------------------------------------
# unknown keys and bad values are rejected as prime-rl rejects them


def with_key(config: dict, dotted: str, value: object) -> dict:
    node = config
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[parts[-1]] = value
    return config


@pytest.mark.parametrize(
    "dotted",
    [
        "max_step",
        "orchestrator.batch_szie",
        "orchestrator.train.sampling.max_tokens",
        "orchestrator.train.source.0.legacy.idd",
        "orchestrator.renderer.enable_thinkin",
        "trainer.optim.momentum",  # an SGD field, not an AdamW one
        "trainer.ckpt.weigths_only",
        "trainer.loss.kl_coef",  # the job field's name is not prime-rl's
        "ckpt.weights_only",  # trainer-only: the shared [ckpt] has no such key
        "deployment.num_gpus",
        "model.revision",
    ],
)
def test_unknown_keys_are_rejected(dotted: str) -> None:
    config = with_key(compiled_toml(job()), dotted, 1)
    expected = dotted.replace(".0.", "[0].")
    assert [(p.path, p.kind, p.message) for p in rl_config_problems(config)] == [(expected, "extra_forbidden", "Extra inputs are not permitted")]


def test_vllm_settings_have_no_table_of_their_own() -> None:
    config = with_key(compiled_toml(job()), "inference.vllm", {"max_model_len": 512})
    assert [(p.path, p.kind) for p in rl_config_problems(config)] == [("inference.vllm", "extra_forbidden")]


def test_union_variant_decides_which_keys_exist() -> None:
    config = compiled_toml(job())
    config["trainer"]["optim"] = {"type": "sgd", "lr": 0.1, "momentum": 0.5}
    assert rl_config_problems(config) == []
    config["trainer"]["optim"] = {"lr": 0.1, "betas1": 0.8}  # no type: AdamW is filled in (pydantic_config BaseConfig)
    assert rl_config_problems(config) == []
    config["trainer"]["optim"] = {"type": "sgd", "lr": 0.1, "betas1": 0.8}
    assert [(p.path, p.kind) for p in rl_config_problems(config)] == [("trainer.optim.betas1", "extra_forbidden")]
    config["trainer"]["optim"] = {"type": "lion", "lr": 0.1}
    assert [(p.path, p.kind) for p in rl_config_problems(config)] == [("trainer.optim.type", "tag")]
    config = compiled_toml(job())
    config["orchestrator"]["renderer"] = {"name": "default", "tool_parser": "qwen3", "any_template_kwarg": True}
    assert rl_config_problems(config) == []  # DefaultRendererConfig allows extra keys
    del config["orchestrator"]["renderer"]["name"]
    assert [(p.path, p.message) for p in rl_config_problems(config)] == [("orchestrator.renderer", "Unable to extract tag using discriminator 'name'")]
    config = compiled_toml(job())
    config["orchestrator"]["post_batch_filters"] = [{"enforce": False}]  # a list item gets no default tag
    assert [(p.path, p.kind) for p in rl_config_problems(config)] == [("orchestrator.post_batch_filters[0]", "tag")]


@pytest.mark.parametrize(
    ("dotted", "value", "kind"),
    [
        ("orchestrator.batch_size", "64", "type"),
        ("orchestrator.group_size", True, "type"),
        ("orchestrator.train.sampling.temperature", 2.5, "bound"),
        ("trainer.optim.lr", -1.0, "bound"),
        ("trainer.model.lora", {"rank": 8, "dropout": 1.5}, "bound"),
        ("ckpt.keep_last", 0, "bound"),
        ("inference.model.dtype", "fp8", "choice"),
        ("orchestrator.train.source", {"name": "x"}, "type"),
        ("deployment.type", "two_node", "tag"),
    ],
)
def test_bad_values_are_rejected(dotted: str, value: object, kind: str) -> None:
    problems = rl_config_problems(with_key(compiled_toml(job()), dotted, value))
    assert [p.kind for p in problems] == [kind], problems


def test_required_sections_and_none_strings() -> None:
    config = compiled_toml(job())
    del config["trainer"]
    assert [(p.path, p.message) for p in rl_config_problems(config)] == [("trainer", "Field required")]
    config = with_key(compiled_toml(job()), "orchestrator.batch_size", "None")  # TOML's way to write None
    assert rl_config_problems(config) == []
    assert rl_config_problems(with_key(compiled_toml(job()), "orchestrator.group_size", "None"))[0].kind == "type"


@pytest.mark.parametrize(
    ("dotted", "value", "path"),
    [
        ("orchestrator.batch_size", 60, "orchestrator.batch_size"),
        ("trainer.model.name", "Qwen/Qwen3-1.7B", "trainer.model.name"),
        ("orchestrator.max_steps", 7, "orchestrator.max_steps"),
        ("trainer.ckpt.interval", 3, "trainer.ckpt.interval"),
        ("trainer.model.seq_len", 256, "trainer.model.seq_len"),
        ("orchestrator.train.source.0.name", "agg", "orchestrator.train.source[0].name"),
        ("orchestrator.train.source.0.legacy", {}, "orchestrator.train.source[0]"),
        ("orchestrator.post_batch_filters", [{"type": "zero_advantage"}, {"type": "zero_advantage", "enforce": False}], "orchestrator.post_batch_filters"),
        ("weight_broadcast", {"type": "nccl"}, "weight_broadcast.type"),
    ],
)
def test_cross_field_rules_of_the_release(dotted: str, value: object, path: str) -> None:
    config = compiled_toml(job(model={"name": "Qwen/Qwen3-0.6B", "lora_rank": 4}))
    assert rl_config_problems(config) == []
    problems = rl_config_problems(with_key(config, dotted, value))
    assert [(p.path, p.kind) for p in problems] == [(path, "semantic")]


def test_duplicate_source_names() -> None:
    config = compiled_toml(job())
    config["orchestrator"]["train"]["source"].append(dict(config["orchestrator"]["train"]["source"][0]))
    assert [p.path for p in rl_config_problems(config)] == ["orchestrator.train.source"]


# ---------------------------------------------------------------------------------------------
# every shipped example job compiles; a broken one is caught by the probe


def shipped_job_texts() -> list[str]:
    from tests.unit.test_config_errors import VALID_JOB_TOML
    from tests.unit.test_workspace_probe import JOB

    return [VALID_JOB_TOML, JOB, '[model]\nname = "Qwen/Qwen3-0.6B"\n', '[model]\nname = "Qwen/Qwen3-1.7B"\n']


def sim_agent_jobs() -> list[JobSpec]:
    rng = random.Random(0)
    return [_valid_job(rng, skill, task) for task in TASKS for skill in (0.0, 0.5, 1.0) for _ in range(10)]


def local_agent_job_texts(count: int = 300) -> list[str]:
    """Jobs the local trainer agent can write: random walks of the job language's grammar."""
    rng = random.Random(1)
    texts = []
    for index in range(count):
        tokens: list[int] = []
        while allowed := jl.allowed_next(tokens):
            tokens.append(rng.choice(allowed))
        texts.append(jl.render_job_toml(tokens, seed=index))
    return texts


def test_shipped_and_simulated_jobs_compile() -> None:
    specs = [JobSpec.model_validate(tomllib.loads(text)) for text in shipped_job_texts()] + sim_agent_jobs()
    for spec in specs:
        for task in TASKS:
            if spec.model.name in task.budget.allowed_models:
                assert primerl_compile_problems(spec, task) == [], spec


def test_every_job_the_local_agent_writes_that_passes_the_probe_compiles() -> None:
    passed = 0
    for text in local_agent_job_texts():
        for task in TASKS:
            verdict = probe_job_text(text, task)
            if not verdict.passed:
                continue
            passed += 1
            assert verdict.job is not None
            assert primerl_compile_problems(verdict.job, task) == [], text
            assert probe_job_text(text, task, [primerl_compile_problems]).passed
            assert rl_config_problems(tomllib.loads(render_rl_toml(compile_rl_config(verdict.job, PROBE_ENV_ID)))) == []
    assert passed > 100


def test_every_model_a_task_allows_has_a_renderer() -> None:
    for task in TASKS:
        assert set(task.budget.allowed_models) <= set(MODEL_RENDERERS)


def test_probe_catches_jobs_prime_rl_would_reject() -> None:
    task = TASKS[0]
    hot = '[model]\nname = "Qwen/Qwen3-0.6B"\n[rollout]\ntemperature = 3.0\n'
    assert probe_job_text(hot, task).passed  # our job schema allows it ...
    verdict = probe_job_text(hot, task, [primerl_compile_problems])
    assert not verdict.passed  # ... prime-rl v0.8.0 does not: its sampling temperature is <= 2
    [problem] = verdict.errors
    assert problem.field == "(prime-rl) rollout.temperature"
    assert "orchestrator.train.sampling.temperature" in problem.message and "maximum of 2.0" in problem.message
    assert problem.fix.startswith("use a rollout.temperature between 0 and 2.0")
    assert jl.feedback_kind(problem.field) == "temperature"  # the local policy sees it as a temperature problem

    uneven = '[model]\nname = "Qwen/Qwen3-0.6B"\n[training]\nbatch_size = 12\ngroup_size = 5\n'
    [problem] = primerl_compile_problems(JobSpec.model_validate(tomllib.loads(uneven)), task)
    assert (problem.field, problem.fix) == ("(prime-rl) training.batch_size", "make training.batch_size a multiple of training.group_size")

    other = task.model_copy(update={"budget": task.budget.model_copy(update={"allowed_models": ["meta-llama/Llama-3.2-1B"]})})
    verdict = probe_job_text('[model]\nname = "meta-llama/Llama-3.2-1B"\n', other, [primerl_compile_problems])
    assert [p.field for p in verdict.errors] == ["(prime-rl) model.name"]
    assert jl.feedback_kind(verdict.errors[0].field) == "model"


def test_bundle_names_its_environment_by_content() -> None:
    spec = job()
    module = b"def reward(prompt, completion, answer):\n    return float(completion.strip() == answer)\n"
    data = b'{"prompt": "add 1+1=", "answer": "2"}\n'
    first, second = build_bundle(spec, module, data), build_bundle(spec, module, data)
    assert first.files == second.files and first.manifest.env_id == second.manifest.env_id
    other = build_bundle(spec, module, data + b'{"prompt": "add 2+2=", "answer": "4"}\n')
    assert other.manifest.env_id != first.manifest.env_id
    config = tomllib.loads(first.files["rl.toml"].decode())
    assert config["orchestrator"]["train"]["source"][0]["legacy"]["id"] == first.manifest.env_id
    assert rl_config_problems(config) == []
    assert first.manifest.file_problems({k: v for k, v in first.files.items() if k != "manifest.json"}) == []
