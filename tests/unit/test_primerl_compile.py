"""The job compiler against the pinned prime-rl's rl.toml schema.

The tables below were written by reading prime-rl v0.8.0 (commit 60bc2954):
packages/prime-rl-configs/src/prime_rl/configs/{rl,trainer,orchestrator,inference,shared}.py and
configs/. They pin the field names the compiler relies on; ``metarl/primerl/schema.py`` holds the
full schema the validator uses, and must agree with them.
"""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from metarl.backends.sim import _valid_job
from metarl.policy import job_language as jl
from metarl.primerl.checks import primerl_compile_problems
from metarl.primerl.compiler import (
    MODEL_RENDERERS,
    PROBE_ENV_ID,
    CompileOptions,
    build_bundle,
    compile_rl_config,
    render_rl_toml,
    seq_len_for,
)
from metarl.primerl.pin import PRIME_RL_TAG
from metarl.primerl.schema import RL, Table, Tagged, rl_config_problems, schema_paths
from metarl.probe import probe_job_text
from schemas.base import load_toml_model
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASKS = [load_toml_model(TaskSpec, path) for path in sorted((REPO / "tasks_specs").glob("*.toml"))]

# Field names of the classes on the compiler's paths, as they are at the pinned tag.
PINNED_FIELDS: dict[str, set[str]] = {
    # rl.py RLConfig
    "": {
        "trainer", "orchestrator", "inference", "env_vars", "output_dir", "clean_output_dir", "log", "ckpt", "wandb",
        "file_monitor", "model", "tokenizer", "max_steps", "seq_len", "weight_broadcast", "rollout_transport", "bench",
        "deployment", "slurm", "dry_run",
    },
    # rl.py SharedModelConfig, SharedCheckpointConfig; shared.py FileMonitorConfig
    "model": {"name", "vlm"},
    "ckpt": {"output_dir", "interval", "resume_step", "keep_last", "keep_interval"},
    "file_monitor": {"filename"},
    # trainer.py TrainerConfig, CheckpointConfig, LoRAConfig
    "trainer": {
        "model", "tokenizer", "data", "loss", "optim", "scheduler", "ckpt", "weight_broadcast", "rollout_transport", "log",
        "wandb", "file_monitor", "output_dir", "matmul_precision", "max_steps", "enable_router_replay", "memory_profiler_path",
        "bench", "gc", "trace_path", "dist_timeout_seconds", "heartbeat", "metrics_server", "max_concurrent_runs",
        "enable_token_export", "env_vars",
    },
    "trainer.ckpt": {
        "output_dir", "interval", "weights", "skip_gather_master_weights", "weights_only", "resume_step", "keep_last",
        "keep_interval", "skip_progress", "skip_scheduler", "skip_dataloader", "skip_optimizer",
    },
    "trainer.model.lora": {"rank", "alpha", "dropout", "target_modules", "modules_to_save"},
    # orchestrator.py OrchestratorConfig, TrainConfig, TrainSamplingConfig, TrainSourceConfig; verifiers LegacyEnvConfig
    "orchestrator": {
        "algo", "model", "train", "tokenizer", "renderer", "optim", "eval", "pre_batch_filters", "post_batch_filters", "log",
        "env_vars", "wandb", "prime_monitor", "file_monitor", "collect_inference_metrics", "inference_metrics_roles", "ckpt",
        "weight_broadcast", "rollout_transport", "output_dir", "tasks_per_minute", "env_server_base_port", "batch_size",
        "token_batch_size", "oversampling_factor", "max_inflight_episodes", "group_size", "seq_len", "num_train_workers",
        "max_steps", "max_off_policy_steps", "bench", "heartbeat",
    },
    "orchestrator.train": {"source", "sampling"},
    "orchestrator.train.sampling": {"temperature", "max_completion_tokens", "extra_body"},
    "orchestrator.train.source[]": {"env", "serve", "legacy", "name", "ratio", "sampling", "group_size", "algo"},
    "orchestrator.train.source[].legacy": {"id", "args", "extra_env_kwargs"},
    # inference.py InferenceConfig (the model block: vLLM's max_model_len lives in [inference.model])
    "inference.model": {
        "name", "trust_remote_code", "vlm", "dtype", "max_model_len", "enforce_eager", "chat_template", "tool_call_parser",
        "reasoning_parser", "rope_scaling",
    },
}
PINNED_VARIANTS: dict[str, dict[str, set[str]]] = {
    "deployment": {"single_node": {"gpus_per_node", "num_train_gpus", "num_infer_gpus"}},
    "trainer.optim": {"adamw": {"lr", "weight_decay", "max_norm", "betas1", "betas2"}},
    "trainer.loss": {"default": {"dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau"}},
    "orchestrator.renderer": {"qwen3": {"thinking_retention", "enable_thinking"}},
}
PINNED_TYPES = {
    "max_steps": "int | None",
    "seq_len": "int | None",
    "output_dir": "path",
    "model.name": "str",
    "trainer.optim<type=adamw>.lr": "float",
    "trainer.loss<type=default>.kl_tau": "float",
    "trainer.ckpt.weights_only": "bool",
    "trainer.model.lora.rank": "int",
    "trainer.model.lora.alpha": "float",
    "orchestrator.batch_size": "int | None",
    "orchestrator.group_size": "int",
    "orchestrator.max_off_policy_steps": "int",
    "orchestrator.train.sampling.temperature": "float",
    "orchestrator.train.sampling.max_completion_tokens": "int | None",
    "orchestrator.train.source[].name": "str | None",
    "orchestrator.train.source[].legacy.id": "str | None",
    "orchestrator.renderer<name=qwen3>.enable_thinking": "bool",
    "inference.gpu_memory_utilization": "float",
    "inference.seed": "int",
    "inference.model.max_model_len": "int | None",
    "deployment<type=single_node>.num_train_gpus": "int",
}


def table_at(path: str) -> Table:
    node = RL
    for part in [p for p in path.split(".") if p]:
        if part.endswith("[]"):
            node = node.fields[part[:-2]].item
        else:
            node = node.fields[part]
    assert isinstance(node, Table), path
    return node


@pytest.mark.parametrize("path", sorted(PINNED_FIELDS))
def test_schema_holds_the_pinned_field_names(path: str) -> None:
    assert set(table_at(path).fields) == PINNED_FIELDS[path]


def test_schema_holds_the_pinned_variants_and_types() -> None:
    for path, variants in PINNED_VARIANTS.items():
        parent, _, key = path.rpartition(".")
        node = table_at(parent).fields[key]
        assert isinstance(node, Tagged)
        for tag, names in variants.items():
            assert set(node.variants[tag].fields) == names
    paths = schema_paths()
    for path, described in PINNED_TYPES.items():
        assert paths[path] == described, path
    assert table_at("trainer").fields["optim"].default == "adamw"  # type: ignore[union-attr]
    assert RL.required == {"trainer", "orchestrator"}


def job(**sections: object) -> JobSpec:
    return JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, **sections})


def compiled(spec: JobSpec) -> dict:
    return tomllib.loads(render_rl_toml(compile_rl_config(spec, PROBE_ENV_ID)))


# ---------------------------------------------------------------------------------------------
# the compiled config


def test_defaults_compile_to_the_expected_rl_toml() -> None:
    config = compiled(job())
    assert rl_config_problems(config) == []
    assert config["max_steps"] == 40 and config["model"] == {"name": "Qwen/Qwen3-0.6B"}
    assert config["deployment"] == {"type": "single_node", "gpus_per_node": 2, "num_train_gpus": 1, "num_infer_gpus": 1}
    assert config["orchestrator"]["batch_size"] == 64 and config["orchestrator"]["group_size"] == 8
    assert config["orchestrator"]["train"]["sampling"] == {"temperature": 1.0, "max_completion_tokens": 16}
    assert config["orchestrator"]["train"]["source"] == [{"name": "metarl-job", "legacy": {"id": PROBE_ENV_ID}}]
    assert config["orchestrator"]["renderer"] == {"name": "qwen3", "enable_thinking": False}
    assert config["trainer"]["optim"] == {"type": "adamw", "lr": 1e-3}
    assert "loss" not in config["trainer"] and "model" not in config["trainer"]
    assert config["ckpt"] == {} and config["file_monitor"] == {} and config["trainer"]["ckpt"] == {"weights_only": True}
    assert config["inference"]["model"]["max_model_len"] == config["seq_len"] == 512
    assert render_rl_toml({}).startswith(f"# Compiled by metarl for prime-rl {PRIME_RL_TAG}")


def test_every_job_setting_lands_in_its_rl_toml_key() -> None:
    spec = job(
        model={"name": "Qwen/Qwen3-1.7B", "lora_rank": 16},
        training={"learning_rate": 3e-5, "max_steps": 200, "batch_size": 96, "group_size": 12, "kl_coef": 0.05, "seed": 7},
        rollout={"temperature": 0.7, "max_tokens": 600},
    )
    config = compiled(spec)
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


def test_pod_options_are_respected_and_checked() -> None:
    config = compile_rl_config(job(), PROBE_ENV_ID, CompileOptions(num_train_gpus=2, num_infer_gpus=2, gpus_per_node=4, max_off_policy_steps=3))
    assert rl_config_problems(config) == []
    assert config["orchestrator"]["max_off_policy_steps"] == 3
    too_many = compile_rl_config(job(), PROBE_ENV_ID, CompileOptions(num_train_gpus=2, num_infer_gpus=2, gpus_per_node=2))
    assert [p.path for p in rl_config_problems(too_many)] == ["deployment"]


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
        "inference.vllm.max_model_len",  # vLLM settings live in [inference] and [inference.model] at v0.8.0
        "deployment.num_gpus",
        "model.revision",
    ],
)
def test_unknown_keys_are_rejected(dotted: str) -> None:
    config = with_key(compiled(job()), dotted, 1)
    problems = rl_config_problems(config)
    expected = dotted.replace(".0.", "[0].") if ".0." in dotted else dotted
    if dotted.startswith("inference.vllm"):
        expected = "inference.vllm"
    assert [(p.path, p.kind, p.message) for p in problems] == [(expected, "extra_forbidden", "Extra inputs are not permitted")]


def test_union_variant_decides_which_keys_exist() -> None:
    config = compiled(job())
    config["trainer"]["optim"] = {"type": "sgd", "lr": 0.1, "momentum": 0.5}
    assert rl_config_problems(config) == []
    config["trainer"]["optim"] = {"lr": 0.1, "betas1": 0.8}  # no type: AdamW is filled in
    assert rl_config_problems(config) == []
    config["trainer"]["optim"] = {"type": "lion", "lr": 0.1}
    assert rl_config_problems(config)[0].kind == "tag"
    config = compiled(job())
    config["orchestrator"]["renderer"] = {"name": "default", "tool_parser": "qwen3", "any_template_kwarg": True}
    assert rl_config_problems(config) == []  # DefaultRendererConfig allows extra keys
    del config["orchestrator"]["renderer"]["name"]
    assert rl_config_problems(config)[0].message == "Unable to extract tag using discriminator 'name'"


@pytest.mark.parametrize(
    ("dotted", "value", "kind"),
    [
        ("orchestrator.batch_size", "64", "type"),
        ("orchestrator.batch_size", 0, "bound"),
        ("orchestrator.group_size", True, "type"),
        ("orchestrator.train.sampling.temperature", 2.5, "bound"),
        ("trainer.optim.lr", -1.0, "bound"),
        ("trainer.model.lora", {"rank": 0}, "bound"),
        ("orchestrator.max_off_policy_steps", -1, "bound"),
        ("inference.model.dtype", "fp8", "choice"),
        ("orchestrator.train.source", {"name": "x"}, "type"),
        ("orchestrator.train.source.0.env", {"taskset": {"id": "x"}}, "unheld"),
        ("slurm", {"partition": "gpu"}, "unheld"),
    ],
)
def test_bad_values_are_rejected(dotted: str, value: object, kind: str) -> None:
    problems = rl_config_problems(with_key(compiled(job()), dotted, value))
    assert [p.kind for p in problems] == [kind]


def test_required_sections_and_none_strings() -> None:
    config = compiled(job())
    del config["trainer"]
    assert [(p.path, p.message) for p in rl_config_problems(config)] == [("trainer", "Field required")]
    config = with_key(compiled(job()), "orchestrator.batch_size", "None")  # TOML's way to write None
    assert rl_config_problems(config) == []
    assert rl_config_problems(with_key(compiled(job()), "orchestrator.group_size", "None"))[0].kind == "type"


@pytest.mark.parametrize(
    ("dotted", "value", "path"),
    [
        ("orchestrator.batch_size", 60, "orchestrator.batch_size"),
        ("trainer.model.name", "Qwen/Qwen3-1.7B", "trainer.model.name"),
        ("orchestrator.max_steps", 7, "orchestrator.max_steps"),
        ("orchestrator.renderer", {"name": "auto"}, "orchestrator.renderer.name"),
        ("trainer.model.seq_len", 256, "trainer.model.seq_len"),
        ("orchestrator.train.source.0.name", "agg", "orchestrator.train.source[0].name"),
        ("orchestrator.train.source.0.legacy", {}, "orchestrator.train.source[0]"),
        ("env_vars", {"CUDA_VISIBLE_DEVICES": "0"}, "env_vars"),
        ("weight_broadcast", {"type": "nccl"}, "weight_broadcast.type"),
    ],
)
def test_cross_field_rules_of_the_release(dotted: str, value: object, path: str) -> None:
    config = compiled(job(model={"name": "Qwen/Qwen3-0.6B", "lora_rank": 4}))
    assert rl_config_problems(config) == []
    problems = rl_config_problems(with_key(config, dotted, value))
    assert [(p.path, p.kind) for p in problems] == [(path, "semantic")]


def test_duplicate_source_names() -> None:
    config = compiled(job())
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
    assert "orchestrator.train.sampling.temperature" in problem.message and "<= 2" not in problem.field
    assert jl.feedback_kind(problem.field) == "temperature"  # the local policy sees it as a temperature problem

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
