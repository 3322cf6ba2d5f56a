"""The `tinker` trainer agent: chat rendering, tool-call parsing, the multi-turn loop, the policy sample, costs.

Offline: the sampling client is a fake answering with real `tinker.types` objects (tests/unit/test_tinker_fakes.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import tinker

from metarl.backends.tinker.agent import (
    CHAT_FORMATS,
    NO_CALL_NOTE,
    NOT_SAMPLED,
    UNTERMINATED_NOTE,
    ConversationLimits,
    TinkerAgent,
    agent_costs,
    clip_observation,
    cut_note,
    defang,
    first_prompt_text,
    is_sampled,
    observation_text,
    parse_reply,
    parse_xml_call,
    run_conversation,
    turn_seed,
)
from metarl.backends.tinker.client import SampledTurn, TinkerGateway, TinkerPolicyRef
from metarl.backends.tinker.config import TinkerAgentBackend
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import EpisodeContext
from metarl.probe.workspace import probe_workspace
from metarl.workspace import Workspace, tool_specs
from schemas.base import FieldProblem
from tests.unit.test_tinker_fakes import BEHAVIOUR_LOGPROB, IM_END, FakeService, FakeTokenizer, extends, server_failure, user_failure
from tests.unit.test_workspace_probe import GOOD_ENV, JOB, LIMITS, dataset_text, make_task

BASE_MODEL = "Qwen/Qwen3-30B-A3B"
REF = TinkerPolicyRef(base_model=BASE_MODEL, version=3, state_path="tinker://run0/weights/v3", sampler_path="tinker://run0/sampler_weights/v3")


def agent_config(**overrides) -> TinkerAgentBackend:
    values = {
        "type": "tinker",
        "base_model": BASE_MODEL,
        "renderer": "qwen3",
        "max_turns": 8,
        "max_tokens_per_turn": 8192,
        "usd_per_million_prompt_tokens": 0.5,
        "usd_per_million_cached_prompt_tokens": 0.1,
        "usd_per_million_sample_tokens": 2.0,
    }
    values.update(overrides)
    return TinkerAgentBackend.model_validate(values)


def context(tmp_path: Path, attempt: int = 1, feedback: list[FieldProblem] | None = None, state: str | None = REF.encode()) -> EpisodeContext:
    return EpisodeContext(
        run_id="run-1",
        episode_id=7,
        task=make_task(),
        policy_version=3,
        probe_attempt=attempt,
        seed=11,
        feedback=feedback or [],
        artifacts_root=str(tmp_path / "artifacts"),
        policy_state_uri=state,
    )


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def run_agent(tmp_path: Path, script: list[str], **overrides):
    service = FakeService(script=list(script))
    agent = TinkerAgent(agent_config(**overrides), connect_to=lambda: TinkerGateway(service=service))
    return agent.run_attempt(context(tmp_path)), service


GOOD_SCRIPT = [
    "<think>\nFirst see what is there.\n</think>\n\n" + call("list_files"),
    "I write the job first.\n" + call("write_file", path="job.toml", content=JOB),
    call("write_file", path="environment.py", content=GOOD_ENV) + "\n" + call("write_file", path="dataset.jsonl", content=dataset_text()),
    call("submit"),
]


# --------------------------------------------------------------------------------------------
# pure pieces


def test_first_prompt_declares_every_tool_and_holds_the_task() -> None:
    text = first_prompt_text(CHAT_FORMATS["qwen3"], "# Task: Add\nAdd two numbers.", tool_specs())
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    for spec in tool_specs():
        assert f'"name": "{spec["name"]}"' in text
    assert "# Task: Add" in text and text.count("<|im_end|>") == 2
    no_think = first_prompt_text(CHAT_FORMATS["qwen3_disable_thinking"], "x", tool_specs())
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<function=TOOL_NAME>" in first_prompt_text(CHAT_FORMATS["qwen3_5"], "x", tool_specs())


def test_observation_continues_after_the_end_token_and_opens_the_next_turn() -> None:
    text = observation_text(CHAT_FORMATS["qwen3"], ['{"ok": true}'], ["a note"])
    assert text == '\n<|im_start|>user\n<tool_response>\n{"ok": true}\n</tool_response>\na note<|im_end|>\n<|im_start|>assistant\n'


def test_parse_reply_json_xml_thinking_and_unterminated() -> None:
    parsed = parse_reply('<think>maybe <tool_call>{"name": "submit"}</tool_call></think>' + call("list_files") + "\ntext\n" + call("submit"))
    assert parsed.calls == ('{"name": "list_files", "arguments": {}}', '{"name": "submit", "arguments": {}}')
    assert not parsed.unterminated
    xml = "<tool_call>\n<function=read_file>\n<parameter=path>\njob.toml\n</parameter>\n<parameter=offset>\n12\n</parameter>\n</function>\n</tool_call>"
    assert parse_reply(xml).calls == ({"name": "read_file", "arguments": {"path": "job.toml", "offset": 12}},)
    content = "line 1\n\nline 3\n"
    write = (
        f"<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call>"
    )
    assert parse_reply(write).calls[0]["arguments"]["content"] == content
    assert parse_reply("no calls here").calls == ()
    cut = parse_reply(call("list_files") + '\n<tool_call>\n{"name": "write_file", "argu')
    assert cut.unterminated and len(cut.calls) == 1
    assert parse_reply("<think>long thought cut off <tool_call>").calls == ()
    assert parse_xml_call("{}") is None


def test_defang_and_clip_observation() -> None:
    assert "<|im_end|>" not in defang('{"content": "x<|im_end|>y</tool_response>"}')
    assert clip_observation("abc", 10) == "abc"
    clipped = clip_observation("x" * 100, 10)
    assert clipped.startswith("x" * 10) and "90 more characters" in clipped


def test_costs_are_prompt_and_sample_tokens_at_the_configured_prices() -> None:
    items = agent_costs(agent_config(), "run-1", 7, 2, prompt_tokens=3_000_000, sampled_tokens=500_000)
    assert [(i.source, i.unit, i.quantity, i.key) for i in items] == [
        ("tinker", "token", 3_000_000, "tinker:agent:run-1:7:2:prompt"),
        ("tinker", "token", 500_000, "tinker:agent:run-1:7:2:sample"),
    ]
    assert items[0].quantity * items[0].unit_price_usd == pytest.approx(1.5)
    assert items[1].quantity * items[1].unit_price_usd == pytest.approx(1.0)
    assert agent_costs(agent_config(), "run-1", 7, 2, 0, 0) == []


def test_prompt_cache_hits_are_billed_at_the_cached_price() -> None:
    items = agent_costs(agent_config(), "run-1", 7, 2, prompt_tokens=3_000_000, sampled_tokens=500_000, cached_prompt_tokens=2_000_000)
    assert [(i.key.rsplit(":", 1)[1], i.quantity, i.quantity * i.unit_price_usd) for i in items] == [
        ("prompt", 1_000_000, pytest.approx(0.5)),
        ("cached_prompt", 2_000_000, pytest.approx(0.2)),
        ("sample", 500_000, pytest.approx(1.0)),
    ]
    with pytest.raises(ValueError, match="cached prompt tokens"):
        agent_costs(agent_config(), "run-1", 7, 2, prompt_tokens=10, sampled_tokens=1, cached_prompt_tokens=11)


def test_turn_seeds_are_reproducible_and_differ() -> None:
    seeds = {turn_seed(11, 1, t) for t in range(20)}
    assert len(seeds) == 20 and turn_seed(11, 1, 3) == turn_seed(11, 1, 3) and turn_seed(11, 2, 3) != turn_seed(11, 1, 3)


# --------------------------------------------------------------------------------------------
# one attempt, end to end against the fake sampling client


def test_multi_turn_episode_writes_a_workspace_that_passes_the_probe(tmp_path: Path) -> None:
    submission, service = run_agent(tmp_path, GOOD_SCRIPT)
    files = Path(submission.workspace_uri)
    verdict = probe_workspace(files, make_task(), limits=LIMITS)
    assert verdict.passed, verdict.errors
    assert submission.job_toml == JOB
    assert [entry[0] for entry in service.log] == ["create_sampling_client"] + ["sample"] * 4
    assert service.log[0] == ("create_sampling_client", REF.sampler_path)
    sampler = service.sampling_clients[0]
    assert extends(sampler.prompts, service)
    assert {p.stop[0] for p in sampler.params} == {IM_END} and all(p.max_tokens == 8192 and p.temperature == 1.0 for p in sampler.params)
    assert len({p.seed for p in sampler.params}) == 4
    transcript = [json.loads(line) for line in (files.parent / "transcript.jsonl").read_text().splitlines()]
    assert [(e["tool"], e["ok"]) for e in transcript] == [
        ("list_files", True),
        ("write_file", True),
        ("write_file", True),
        ("write_file", True),
        ("submit", True),
    ]


def test_policy_sample_is_one_sequence_with_behaviour_logprobs_only_on_sampled_tokens(tmp_path: Path) -> None:
    submission, service = run_agent(tmp_path, GOOD_SCRIPT)
    sample, tok = submission.sample, FakeTokenizer()
    assert sample is not None
    prompt, rest = sample.tokens[: sample.prompt_length], sample.tokens[sample.prompt_length :]
    assert prompt == service.sampling_clients[0].prompts[0]
    assert sample.tokens == service.sampling_clients[0].last  # the final prompt plus the final reply
    assert len(sample.logprobs) == len(rest)
    sampled = [t for t, lp in zip(rest, sample.logprobs) if is_sampled(lp)]
    assert all(lp == pytest.approx(BEHAVIOUR_LOGPROB) for lp in sample.logprobs if is_sampled(lp))
    assert tok.decode(sampled) == "".join(text + "<|im_end|>" for text in GOOD_SCRIPT)
    assert submission.agent_tokens == len(sampled)
    observations = tok.decode([t for t, lp in zip(rest, sample.logprobs) if lp == NOT_SAMPLED])
    assert observations.count("<tool_response>") == 4 and observations.count("<|im_start|>assistant\n") == 3
    prompts = service.sampling_clients[0].prompts
    prompt_tokens = sum(len(p) for p in prompts)
    # every turn after the first re-sends the previous prompt and reply: the service reports them as cache hits
    cached = sum(len(earlier) + len(tok.encode(text)) + 1 for earlier, text in zip(prompts[:-1], GOOD_SCRIPT[:-1]))
    assert cached > 0
    assert [(c.key.rsplit(":", 1)[1], c.quantity) for c in submission.costs] == [
        ("prompt", prompt_tokens - cached),
        ("cached_prompt", cached),
        ("sample", len(sampled)),
    ]


def test_xml_tool_calls_of_qwen3_5(tmp_path: Path) -> None:
    def xml(name: str, **arguments: str) -> str:
        params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    script = [
        xml("write_file", path="job.toml", content=JOB),
        xml("write_file", path="environment.py", content=GOOD_ENV),
        xml("write_file", path="dataset.jsonl", content=dataset_text()),
        xml("submit"),
    ]
    submission, _ = run_agent(tmp_path, script, renderer="qwen3_5")
    assert submission.job_toml == JOB
    assert probe_workspace(Path(submission.workspace_uri), make_task(), limits=LIMITS).passed


def test_malformed_calls_get_feedback_and_are_recorded(tmp_path: Path) -> None:
    script = [
        "I think I am done.",  # no tool call
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "job.toml"\n</tool_call>',  # bad JSON
        call("delete_everything"),  # unknown tool
        call("read_file", path="../secrets"),  # path out of the workspace
        call("submit"),  # nothing written yet
        call("write_file", path="job.toml", content=JOB) + '\n<tool_call>\n{"name": "submit"',  # unterminated second call
        call("submit"),
    ]
    submission, service = run_agent(tmp_path, script)
    prompts = service.sampling_clients[0].prompts
    tok = FakeTokenizer()
    feedback = [tok.decode(later[len(earlier) :]) for earlier, later in zip(prompts, prompts[1:])]
    assert NO_CALL_NOTE in feedback[0]
    assert '"kind":"bad_call"' in feedback[1] and "not valid JSON" in feedback[1] and '"fix"' in feedback[1]
    assert "unknown tool" in feedback[2]
    assert '"kind":"bad_path"' in feedback[3]
    assert '"kind":"incomplete"' in feedback[4]
    assert UNTERMINATED_NOTE in feedback[5] and '"tool":"write_file","result"' in feedback[5]
    assert submission.job_toml == JOB
    transcript = [json.loads(line) for line in (Path(submission.workspace_uri).parent / "transcript.jsonl").read_text().splitlines()]
    assert [e["tool"] for e in transcript] == ["(invalid)", "(invalid)", "read_file", "submit", "write_file", "submit"]
    assert [e["ok"] for e in transcript] == [False, False, False, False, True, True]


def test_turn_cap_ends_the_attempt_without_submit(tmp_path: Path) -> None:
    submission, service = run_agent(tmp_path, [call("list_files")] * 10, max_turns=3)
    assert len(service.sampling_clients[0].prompts) == 3
    assert submission.job_toml == ""
    assert len(service.script) == 7
    verdict = probe_workspace(Path(submission.workspace_uri), make_task(), limits=LIMITS)
    assert not verdict.passed and verdict.errors[0].field == "job.toml"


def test_too_many_calls_in_one_reply_and_a_reply_cut_at_max_tokens(tmp_path: Path) -> None:
    five = "\n".join([call("list_files")] * 5)
    assert len(five) < 400
    script = [five, "x" * 500 + call("list_files"), call("submit")]
    submission, service = run_agent(tmp_path, script, max_tool_calls_per_turn=2, max_tokens_per_turn=400, max_turns=3)
    prompts, tok = service.sampling_clients[0].prompts, FakeTokenizer()
    first = tok.decode(prompts[1][len(prompts[0]) :])
    assert first.count("<tool_response>") == 2 and "Only the first 2 tool calls of a reply run; 3 more were ignored." in first
    second = tok.decode(prompts[2][len(prompts[1]) :])
    assert second.startswith("x" * 400 + "<|im_end|>\n<|im_start|>user\n")
    assert cut_note(400) in second and NO_CALL_NOTE in second
    # the cut reply was closed with an end token the policy did not sample
    sample = submission.sample
    assert sample is not None
    rest = sample.tokens[sample.prompt_length :]
    closing = [i for i in range(1, len(rest)) if rest[i] == IM_END and sample.logprobs[i] == NOT_SAMPLED and is_sampled(sample.logprobs[i - 1])]
    assert len(closing) == 1 and tok.decode(rest[closing[0] - 3 : closing[0]]) == "xxx"


def test_context_cap_stops_before_the_budget_is_exceeded(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "attempt", make_task())
    tok = FakeTokenizer()
    replies = iter([call("read_file", path="TASK.md")] * 10)

    def sample_turn(prompt: list[int], turn: int, stop: tuple[int, ...], max_tokens: int) -> SampledTurn:
        tokens = tok.encode(next(replies)) + [IM_END]
        return SampledTurn(tokens=tuple(tokens), logprobs=(-0.5,) * len(tokens), stop_reason="stop", prompt_tokens=len(prompt))

    first = len(tok.encode(first_prompt_text(CHAT_FORMATS["qwen3"], (workspace.files_dir / "TASK.md").read_text(), tool_specs())))
    limits = ConversationLimits(max_turns=10, max_tokens_per_turn=100, max_context_tokens=first + 3000, max_observation_chars=1000, max_tool_calls_per_turn=4)
    convo = run_conversation(workspace, CHAT_FORMATS["qwen3"], tok, sample_turn, limits)
    assert convo.ended == "context_cap" and len(convo.tokens) <= limits.max_context_tokens and convo.turns >= 2
    assert " more characters; read files in parts" in tok.decode(convo.tokens)
    with pytest.raises(PermanentBackendError, match="max_context_tokens"):
        run_conversation(workspace, CHAT_FORMATS["qwen3"], tok, sample_turn, ConversationLimits(10, 100, first, 1000, 4))


def test_each_turns_max_tokens_is_capped_at_the_context_left(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "attempt", make_task())
    tok = FakeTokenizer()
    asked: list[tuple[int, int]] = []

    def sample_turn(prompt: list[int], turn: int, stop: tuple[int, ...], max_tokens: int) -> SampledTurn:
        asked.append((len(prompt), max_tokens))
        tokens = tok.encode(call("read_file", path="TASK.md")) + [IM_END]
        return SampledTurn(tokens=tuple(tokens), logprobs=(-0.5,) * len(tokens), stop_reason="stop", prompt_tokens=len(prompt))

    first = len(tok.encode(first_prompt_text(CHAT_FORMATS["qwen3"], (workspace.files_dir / "TASK.md").read_text(), tool_specs())))
    limits = ConversationLimits(max_turns=10, max_tokens_per_turn=2000, max_context_tokens=first + 2500, max_observation_chars=1000, max_tool_calls_per_turn=4)
    convo = run_conversation(workspace, CHAT_FORMATS["qwen3"], tok, sample_turn, limits)
    assert asked[0] == (first, 2000)
    assert any(m < 2000 for _, m in asked), "no turn ran with less than a full turn of context left"
    assert all(m == min(2000, limits.max_context_tokens - p - 1) and p + m < limits.max_context_tokens for p, m in asked)
    assert convo.ended == "context_cap" and all(m >= 256 for _, m in asked)


def test_the_default_context_fits_the_models_window_so_the_service_never_refuses_a_turn(tmp_path: Path) -> None:
    # the service refuses prompt + max_tokens past Qwen3-30B-A3B's 32,768 tokens; a turn may ask for 30,000
    service = FakeService(script=list(GOOD_SCRIPT), context_window=32_768)
    config = agent_config(max_tokens_per_turn=30_000)
    assert config.max_context_tokens == 32_768
    agent = TinkerAgent(config, connect_to=lambda: TinkerGateway(service=service))
    agent.run_attempt(context(tmp_path))
    sampler = service.sampling_clients[0]
    assert len(sampler.params) == len(GOOD_SCRIPT)
    assert [p.max_tokens for p in sampler.params] == [32_768 - len(prompt) - 1 for prompt in sampler.prompts]


def test_probe_feedback_of_the_previous_attempt_is_in_the_first_prompt(tmp_path: Path) -> None:
    service = FakeService(script=[call("submit")])
    agent = TinkerAgent(agent_config(max_turns=1), connect_to=lambda: TinkerGateway(service=service))
    problem = FieldProblem(field="training.batch_size", message="not divisible by group_size", fix="use a multiple of 8")
    agent.run_attempt(context(tmp_path, attempt=2, feedback=[problem]))
    first = FakeTokenizer().decode(service.sampling_clients[0].prompts[0])
    assert "training.batch_size: not divisible by group_size. Fix: use a multiple of 8" in first


def test_bad_policy_state_is_a_permanent_error(tmp_path: Path) -> None:
    agent = TinkerAgent(agent_config(), connect_to=lambda: TinkerGateway(service=FakeService()))
    for state, needle in [
        (None, "no saved state"),
        ("/tmp/v00001.pt", "not a Tinker policy reference"),
        (REF.model_copy(update={"base_model": "other/model"}).encode(), "LoRA of other/model"),
    ]:
        with pytest.raises(PermanentBackendError, match=needle):
            agent.run_attempt(context(tmp_path, state=state))


def test_sdk_errors_while_sampling_are_classified(tmp_path: Path) -> None:
    cases = [
        (server_failure("sample"), TransientBackendError),
        (user_failure("sample"), PermanentBackendError),
        (
            tinker.RateLimitError("slow down", response=httpx.Response(429, request=httpx.Request("POST", "http://127.0.0.1/")), body=None),
            TransientBackendError,
        ),
        (
            tinker.AuthenticationError("bad key", response=httpx.Response(401, request=httpx.Request("POST", "http://127.0.0.1/")), body=None),
            PermanentBackendError,
        ),
        (tinker.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1/")), TransientBackendError),
    ]
    for exc, kind in cases:
        service = FakeService(script=[call("submit")], fail_next={"sample": [exc]})
        agent = TinkerAgent(agent_config(), connect_to=lambda service=service: TinkerGateway(service=service))
        with pytest.raises(kind):
            agent.run_attempt(context(tmp_path))


def test_a_tokenizer_without_the_end_marker_is_refused(tmp_path: Path) -> None:
    class Plain(FakeTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [1000 + ord(ch) for ch in text]

    workspace = Workspace(tmp_path / "a", make_task())
    with pytest.raises(PermanentBackendError, match="renderer 'qwen3'"):
        run_conversation(workspace, CHAT_FORMATS["qwen3"], Plain(), lambda p, t, s, m: None, ConversationLimits(1, 10, 100_000, 100, 1))  # type: ignore[arg-type,return-value]
