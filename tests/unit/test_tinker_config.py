"""Tinker backends in the run config and the registry; the API key comes only from TINKER_API_KEY and never leaks."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import httpx
import pytest
import tinker
import tomli_w

from metarl import composition as registry
from metarl.backends.tinker import client as tinker_client
from metarl.backends.tinker.agent import TinkerAgent
from metarl.backends.tinker.outer import TinkerOuter
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import EpisodeContext, OuterBatchEpisode
from metarl.runconfig import load_run
from schemas.base import ConfigError, parse_toml_text, validate_model
from schemas.run_config import RunConfig
from tests.unit.test_tinker_agent import call
from tests.unit.test_tinker_fakes import FakeService, FakeTokenizer
from tests.unit.test_workspace_probe import JOB, make_task

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tinker.toml"
SECRET = "tml-live-SECRET-0123456789abcdef"


def example_text() -> str:
    return EXAMPLE.read_text()


def edit(text: str, old: str, new: str) -> str:
    assert old in text, f"example text changed: {old!r} not found"
    return text.replace(old, new, 1)


def config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate_model(RunConfig, parse_toml_text(text, "run.toml"), "run.toml")
    return info.value


def only(err: ConfigError):  # type: ignore[no-untyped-def]
    assert len(err.problems) == 1, err.render()
    return err.problems[0]


@pytest.fixture(autouse=True)
def fresh_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tinker_client, "_SERVICES", {})
    monkeypatch.setattr(tinker_client, "_GATEWAYS", {})


def test_example_loads_and_the_registry_builds_tinker_backends_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    config, specs = load_run(EXAMPLE)
    assert set(specs) == set(config.run.tasks)
    agent, outer = registry.agent_backend(config), registry.outer_backend(config)
    assert isinstance(agent, TinkerAgent) and isinstance(outer, TinkerOuter)
    assert (agent.name, agent.simulated, outer.name, outer.simulated) == ("tinker", False, "tinker", False)
    with pytest.raises(PermanentBackendError, match="TINKER_API_KEY is not set"):
        outer.initial_state("run-1", config)


@pytest.mark.parametrize(
    ("stage", "table", "needle"),
    [
        ("outer", {"type": "sim"}, "must both be `tinker`"),
        ("agent", {"type": "sim"}, "must both be `tinker`"),
        ("outer", {"type": "local"}, "must both be `local`"),
        (
            "outer",
            {"type": "tinker", "usd_per_million_train_tokens": 1.0, "base_url": "https://tinker.example"},
            "backends.outer.base_url must equal backends.agent.base_url",
        ),
    ],
)
def test_tinker_agent_and_outer_come_together(stage: str, table: dict, needle: str) -> None:
    data = tomllib.loads(example_text())
    data["backends"][stage] = table
    assert needle in only(config_error(tomli_w.dumps(data))).message


@pytest.mark.parametrize(
    ("old", "new", "field", "fix"),
    [
        ('renderer = "qwen3"', 'renderer = "llama3"', "backends.agent.renderer", "qwen3_5"),
        ("max_turns = 24", "max_turns = 0", "backends.agent.max_turns", "use a value >= 1"),
        ("max_context_tokens = 32768", "max_context_tokens = 65536", "backends.agent.max_context_tokens", "use a value <= 32768"),
        ("max_context_tokens = 32768", "max_context_tokens = 300000", "backends.agent.max_context_tokens", "use a value <= 262144"),
        (
            'base_model = "Qwen/Qwen3-30B-A3B"\nrenderer = "qwen3"\nmax_turns = 24\nmax_tokens_per_turn = 4096\nmax_context_tokens = 32768',
            'base_model = "acme/Unlisted-7B"\nrenderer = "qwen3"\nmax_turns = 24\nmax_tokens_per_turn = 4096',
            "backends.agent.max_context_tokens",
            "add this key",
        ),
        ("max_tokens_per_turn = 4096", "max_tokens_per_turn = 40000", "backends.agent.max_context_tokens", "correct the value"),
        (
            "usd_per_million_cached_prompt_tokens = 0.125",
            "usd_per_million_cached_prompt_tokens = 0.75",
            "backends.agent.usd_per_million_cached_prompt_tokens",
            "use a value <= 0.5",
        ),
        (
            "usd_per_million_cached_prompt_tokens = 0.125",
            "usd_per_million_cached_prompt_tokens = 2000.0",
            "backends.agent.usd_per_million_cached_prompt_tokens",
            "use a value <= 1000",
        ),
        (
            "usd_per_million_cached_prompt_tokens = 0.125   # prompt tokens the service reports as prefix-cache hits\n",
            "",
            "backends.agent.usd_per_million_cached_prompt_tokens",
            "add this key",
        ),
        ("temperature = 1.0", "temperature = 0.0", "backends.agent.temperature", "use a value > 0"),
        ('base_model = "Qwen/Qwen3-30B-A3B"', 'base_model = "../../etc/passwd"', "backends.agent.base_model", "match the pattern"),
        ("usd_per_million_prompt_tokens = 0.5", "usd_per_million_prompt_tokens = -1.0", "backends.agent.usd_per_million_prompt_tokens", "use a value >= 0"),
        ("usd_per_million_sample_tokens = 1.5\n", "", "backends.agent.usd_per_million_sample_tokens", "add this key"),
        ("lora_rank = 8", "lora_rank = 0", "backends.outer.lora_rank", "use a value >= 1"),
        ('loss = "cispo"', 'loss = "importance_sampling"', "backends.outer.loss", "'cispo'"),
        ('loss = "cispo"', 'loss = "truncated_importance_sampling"', "backends.outer.loss", "'cispo'"),
        ("checkpoint_ttl_s = 604800", "checkpoint_ttl_s = 60", "backends.outer.checkpoint_ttl_s", "use a value >= 3600"),
        ("# final_checkpoint_ttl_s = 604800", "final_checkpoint_ttl_s = 400000000", "backends.outer.final_checkpoint_ttl_s", "use a value <= 315360000"),
        ("lora_rank = 8", 'lora_rank = 8\nbase_url = "ftp://tinker"', "backends.outer.base_url", "match the pattern"),
        ("lora_rank = 8", "lora_rank = 8\nmax_turns = 3", "backends.outer.max_turns", "remove this key"),
    ],
)
def test_bad_tinker_values_name_the_field_and_the_fix(old: str, new: str, field: str, fix: str) -> None:
    problem = only(config_error(edit(example_text(), old, new)))
    assert problem.field == field, problem
    assert fix in problem.fix, problem


@pytest.mark.parametrize(("table", "key"), [("[backends.agent]", "api_key"), ("[backends.outer]", "TINKER_API_KEY"), ("[backends.agent]", "token")])
def test_an_api_key_in_the_config_is_refused_without_being_echoed(table: str, key: str) -> None:
    err = config_error(edit(example_text(), f'{table}\ntype = "tinker"', f'{table}\ntype = "tinker"\n{key} = "{SECRET}"'))
    problem = only(err)
    assert problem.field == table.strip("[]") and "TINKER_API_KEY" in problem.message
    assert SECRET not in err.render() and SECRET not in str(err) and SECRET not in repr(err.problems)


def test_connect_needs_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(PermanentBackendError) as info:
        tinker_client.connect(None, 10.0)
    assert "TINKER_API_KEY" in str(info.value)


def test_connect_builds_the_real_service_client_offline_and_never_shows_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    gateway = tinker_client.connect("http://127.0.0.1:9", 10.0)
    assert isinstance(gateway.service, tinker.ServiceClient)
    assert tinker_client.connect("http://127.0.0.1:9", 10.0) is gateway
    assert SECRET not in repr(gateway) and SECRET not in repr(gateway.service)


def test_the_api_key_reaches_the_sdk_and_nothing_else(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    services: list[FakeService] = []

    def service_client(api_key: str | None = None, base_url: str | None = None, **_: object) -> FakeService:
        service = FakeService(script=[call("write_file", path="job.toml", content=JOB), call("submit")], api_key=api_key, base_url=base_url)
        services.append(service)
        return service

    monkeypatch.setattr(tinker, "ServiceClient", service_client)
    caplog.set_level(logging.DEBUG)
    config, _ = load_run(EXAMPLE)
    outer, agent = registry.outer_backend(config), registry.agent_backend(config)
    state = outer.initial_state("run-1", config)
    ctx = EpisodeContext(
        run_id="run-1", episode_id=1, task=make_task(), policy_version=0, probe_attempt=1, seed=0, artifacts_root=str(tmp_path), policy_state_uri=state
    )
    submission = agent.run_attempt(ctx)
    batch = [
        OuterBatchEpisode(episode_id=1, group_id=1, policy_version=0, reward=1.0, samples=[submission.sample]),
        OuterBatchEpisode(episode_id=2, group_id=1, policy_version=0, reward=0.0, samples=[submission.sample]),
    ]
    result = outer.update("run-1", 1, 1, batch, config, state)
    assert len(services) == 1 and services[0].api_key == SECRET  # one client per process, given the key
    leaked_error = tinker.RequestFailedError(
        f"upstream said: bad header Authorization: Bearer {SECRET}", request_id="r", category=tinker.types.request_error_category.RequestErrorCategory.Server
    )
    services[0].fail_next = {"sample": [leaked_error]}
    with pytest.raises(TransientBackendError) as info:
        agent.run_attempt(ctx.model_copy(update={"probe_attempt": 2}))
    assert "***" in str(info.value)
    texts = [
        caplog.text,
        str(info.value),
        repr(config),
        config.model_dump_json(),
        repr(agent),
        repr(outer),
        repr(tinker_client.connect(None, config.backends.agent.timeout_s)),
        submission.model_dump_json(),
        result.model_dump_json(),
    ]
    texts += [path.read_text() for path in tmp_path.rglob("*") if path.is_file()]
    assert all(SECRET not in text for text in texts)
    assert FakeTokenizer().decode(submission.sample.tokens).count("<tool_call>") >= 2


def test_the_context_defaults_to_the_models_window_and_is_never_over_it() -> None:
    data = tomllib.loads(example_text())
    del data["backends"]["agent"]["max_context_tokens"]
    config = validate_model(RunConfig, data, "run.toml")
    assert config.backends.agent.max_context_tokens == 32_768  # Qwen3-30B-A3B's window, not 65,536
    data["backends"]["agent"]["max_context_tokens"] = 65_536
    problem = only(config_error(tomli_w.dumps(data)))
    assert problem.field == "backends.agent.max_context_tokens" and "32768-token context window" in problem.message and problem.fix == "use a value <= 32768"
    data["backends"]["agent"].update(base_model="Qwen/Qwen3.5-9B", renderer="qwen3_5", max_context_tokens=65_536)
    assert validate_model(RunConfig, data, "run.toml").backends.agent.max_context_tokens == 65_536


def test_checkpoints_expire_by_default() -> None:
    data = tomllib.loads(example_text())
    data["backends"]["outer"].pop("checkpoint_ttl_s")
    outer = validate_model(RunConfig, data, "run.toml").backends.outer
    assert (outer.checkpoint_ttl_s, outer.final_checkpoint_ttl_s) == (7 * 86_400, None)


def test_http_errors_the_sdk_retries_are_transient_and_the_others_permanent() -> None:
    from tinker.lib.retry_handler import is_retryable_status_code

    request = httpx.Request("POST", "http://127.0.0.1/")
    for status in range(400, 600):
        error = tinker.APIStatusError(f"HTTP {status}", response=httpx.Response(status, request=request), body=None)
        expected = TransientBackendError if is_retryable_status_code(status) else PermanentBackendError
        with pytest.raises(expected):
            with tinker_client.classified("sample"):
                raise error
        assert tinker_client.transient_status(status) == is_retryable_status_code(status), status


@pytest.mark.parametrize(("cls", "status"), [(tinker.ConflictError, 409), (tinker.APIStatusError, 408)])
def test_request_timeout_and_lock_conflict_are_transient(cls: type, status: int) -> None:
    error = cls("try again", response=httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/")), body=None)
    with pytest.raises(TransientBackendError, match=f"HTTP {status}"):
        with tinker_client.classified("forward_backward"):
            raise error


def test_a_saved_state_past_its_ttl_cannot_be_resumed_and_a_kept_final_one_can() -> None:
    import datetime as dt

    config, _ = load_run(EXAMPLE)
    outer = config.backends.outer
    saved = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    week = dt.timedelta(seconds=outer.checkpoint_ttl_s)  # type: ignore[attr-defined]
    assert outer.resume_problem(3, saved, saved + week - dt.timedelta(seconds=1), max_outer_steps=20) is None
    problem = outer.resume_problem(3, saved, saved + week, max_outer_steps=20)
    assert problem is not None and "policy version 3's saved state on Tinker expired at 2026-12-08 12:00 UTC" in problem
    assert outer.resume_problem(20, saved, saved + 10 * week, max_outer_steps=20) is None  # the last version is kept (final_checkpoint_ttl_s None)
