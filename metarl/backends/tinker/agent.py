"""The `tinker` trainer agent: an LLM on Tinker that writes the job itself through the workspace tools.

One attempt is one conversation. The prompt is a system turn (role and tool declarations) and a
user turn (the attempt's TASK.md, which lists the probe's problems with the previous attempt).
The policy replies; every tool call in a reply runs in the attempt's workspace
(:class:`metarl.workspace.Workspace`, which records the transcript); the results come back as the
next user turn; this repeats until ``submit()`` succeeds or a cap is hit (turns, or the context
budget). Sampling uses the snapshot sampler weights of the episode's policy version. Each turn's
``max_tokens`` is capped at the context left (window minus prompt, as tinker-cookbook's
``TinkerTokenCompleter`` caps it), so a prompt plus its reply never exceeds ``max_context_tokens``,
which itself fits the base model's window (:data:`metarl.backends.tinker.config.TINKER_CONTEXT_WINDOWS`).

Tokens. The conversation is one token sequence that only grows: each prompt is the previous prompt
plus the exact sampled tokens plus the rendered tool results (never a re-rendering of the history),
so the whole attempt is one :class:`PolicySample`: ``tokens`` = first prompt + everything after it,
``prompt_length`` = the first prompt's length, and ``logprobs`` holds, for every token after the
first prompt, its behaviour logprob if the policy sampled it, or :data:`NOT_SAMPLED` (+1.0, which
no logprob can be) for a token the policy did not sample (tool results, turn headers, an end-of-turn
token added after a reply cut at max_tokens). The `tinker` outer update gives those positions
advantage 0 (`metarl.backends.tinker.outer.sample_datum`).

Chat formats are our own rendering of the Qwen chat markup (``<|im_start|>role ... <|im_end|>``,
``<tool_call>``/``<tool_response>`` blocks; JSON tool calls for Qwen3, XML-style ones for Qwen3.5).
Replies are parsed in both styles whatever the format.

Everything except :class:`TinkerAgent` is a pure function of its arguments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, Protocol

from metarl.backends.tinker.client import SampledTurn, TinkerGateway, TinkerPolicyRef, connect
from metarl.backends.tinker.config import TinkerAgentBackend
from metarl.errors import PermanentBackendError
from metarl.interfaces import AgentSubmission, BackendServices, CostItem, EpisodeContext, PolicySample
from metarl.workspace import JOB_FILE, TASK_FILE, Workspace, WorkspaceError, read_workspace_text, tool_specs
from schemas.backend_config import expect_config
from schemas.run_config import RunConfig

log = logging.getLogger("metarl.tinker.agent")

NOT_SAMPLED = 1.0
"""Logprob placeholder of a token the policy did not sample (no real logprob is positive)."""

EndReason = Literal["submitted", "turn_cap", "context_cap"]


def is_sampled(logprob: float) -> bool:
    """True for a behaviour logprob, False for the :data:`NOT_SAMPLED` placeholder."""
    return logprob <= 0.5


# ---------------------------------------------------------------------------------------------
# chat formats


@dataclass(frozen=True)
class ChatFormat:
    """How turns and tool calls are written for one model family (Qwen chat markup)."""

    name: str
    tool_calls: Literal["json", "xml"]
    assistant_prefill: str = ""
    start: str = "<|im_start|>"
    end: str = "<|im_end|>"


_NO_THINKING = "<think>\n\n</think>\n\n"
CHAT_FORMATS: dict[str, ChatFormat] = {
    "qwen3": ChatFormat("qwen3", "json"),
    "qwen3_disable_thinking": ChatFormat("qwen3_disable_thinking", "json", _NO_THINKING),
    "qwen3_instruct": ChatFormat("qwen3_instruct", "json"),
    "qwen3_5": ChatFormat("qwen3_5", "xml"),
    "qwen3_5_disable_thinking": ChatFormat("qwen3_5_disable_thinking", "xml", _NO_THINKING),
}

ROLE_TEXT = (
    "You are a trainer agent. The user describes a skill that a small language model should learn. "
    "You write a complete reinforcement-learning training job for it, working only through the tools: "
    "read TASK.md, write job.toml, the environment module and the dataset, then call submit. "
    "A validator checks your files after submit and tells you what to fix."
)

JSON_CALL_TEXT = """To call a tool, write a block
<tool_call>
{"name": "TOOL_NAME", "arguments": {ARGUMENTS AS ONE JSON OBJECT}}
</tool_call>"""

XML_CALL_TEXT = """To call a tool, write a block
<tool_call>
<function=TOOL_NAME>
<parameter=ARGUMENT_NAME>
VALUE
</parameter>
</function>
</tool_call>
with one <parameter> block per argument."""


def system_text(fmt: ChatFormat, tools: Sequence[dict[str, Any]]) -> str:
    """The system turn's text: the role, the tools' JSON schemas and how to call them."""
    declarations = "\n".join(json.dumps({"type": "function", "function": spec}, sort_keys=True) for spec in tools)
    how = JSON_CALL_TEXT if fmt.tool_calls == "json" else XML_CALL_TEXT
    return (
        f"{ROLE_TEXT}\n\n# Tools\n\nThe tools, as JSON schemas:\n<tools>\n{declarations}\n</tools>\n\n{how}\n"
        "You may write several blocks in one reply; they run in order. "
        "Their results come back inside <tool_response></tool_response> blocks."
    )


def first_prompt_text(fmt: ChatFormat, task_md: str, tools: Sequence[dict[str, Any]]) -> str:
    """System and user turns, then the open assistant turn the policy continues."""
    user = f"{task_md.rstrip()}\n\n(This is {TASK_FILE}, already in your workspace. Write your files with the tools, then call submit.)"
    return f"{fmt.start}system\n{system_text(fmt, tools)}{fmt.end}\n{fmt.start}user\n{user}{fmt.end}\n{fmt.start}assistant\n{fmt.assistant_prefill}"


def defang(text: str) -> str:
    """Tool output as inert text: chat-markup markers in file contents cannot open or close a turn."""
    return text.replace("<|", "< |").replace("</tool_response>", "</ tool_response>")


def clip_observation(text: str, max_chars: int) -> str:
    """A tool result cut to `max_chars` characters, saying how much was left out."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f" ...(cut: {len(text) - max_chars} more characters; read files in parts with read_file offset)"


def observation_text(fmt: ChatFormat, results: Sequence[str], notes: Sequence[str]) -> str:
    """The user turn after a reply (tool results, then notes), and the next assistant header.

    It starts with the newline that follows the end-of-turn token the reply ended with.
    """
    parts = [f"<tool_response>\n{result}\n</tool_response>" for result in results] + list(notes)
    return f"\n{fmt.start}user\n" + "\n".join(parts) + f"{fmt.end}\n{fmt.start}assistant\n{fmt.assistant_prefill}"


# ---------------------------------------------------------------------------------------------
# parsing replies

_THINKING = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^<function=([^>\n]+)>(.*?)</function>$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_INTEGER = re.compile(r"^-?\d{1,15}$")


@dataclass(frozen=True)
class ParsedReply:
    """The tool calls of one reply, in order (a JSON string for the workspace to parse, or a parsed XML call)."""

    calls: tuple[str | dict[str, Any], ...]
    unterminated: bool = False


@lru_cache(maxsize=1)
def _integer_parameters() -> dict[str, frozenset[str]]:
    """Per tool, the arguments whose JSON-schema type is integer (XML-style values are text)."""
    return {spec["name"]: frozenset(name for name, prop in spec["parameters"]["properties"].items() if prop.get("type") == "integer") for spec in tool_specs()}


def _xml_value(raw: str) -> str:
    """A parameter's text without the one newline the format puts on each side."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def parse_xml_call(body: str) -> dict[str, Any] | None:
    """``<function=NAME><parameter=K>V</parameter>...</function>`` as a tool call, or None if it is not one."""
    match = _FUNCTION.match(body.strip())
    if match is None:
        return None
    name = match.group(1).strip()
    integers = _integer_parameters().get(name, frozenset())
    arguments: dict[str, Any] = {}
    for param in _PARAMETER.finditer(match.group(2)):
        key, value = param.group(1).strip(), _xml_value(param.group(2))
        arguments[key] = int(value.strip()) if key in integers and _INTEGER.match(value.strip()) else value
    return {"name": name, "arguments": arguments}


def parse_reply(text: str) -> ParsedReply:
    """The tool calls of a reply; thinking is ignored; an opened but unclosed block is reported."""
    visible = _THINKING.sub("", text)
    calls: list[str | dict[str, Any]] = []
    for block in _BLOCK.finditer(visible):
        body = block.group(1).strip()
        calls.append(parse_xml_call(body) or body)
    return ParsedReply(calls=tuple(calls), unterminated="<tool_call>" in _BLOCK.sub("", visible))


NO_CALL_NOTE = (
    "Your reply has no <tool_call> block, so nothing ran. Call a tool (list_files, read_file, write_file, "
    "baseline_score), or submit once job.toml, the environment module and the dataset are written."
)
UNTERMINATED_NOTE = "A <tool_call> block in your reply has no closing </tool_call>, so it did not run. Close every block."


def cut_note(max_tokens: int) -> str:
    """What the model is told when its reply hit the token cap."""
    return f"Your reply was cut at {max_tokens} tokens. Keep replies shorter (one large file per reply)."


def too_many_note(limit: int, ignored: int) -> str:
    """What the model is told when a reply holds more calls than run."""
    return f"Only the first {limit} tool calls of a reply run; {ignored} more were ignored."


# ---------------------------------------------------------------------------------------------
# one conversation


class Tokenizer(Protocol):
    """The subset of a Hugging Face tokenizer the agent uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


SampleTurn = Callable[[list[int], int, tuple[int, ...], int], SampledTurn]
"""``(prompt tokens, turn index, stop token ids, max_tokens) -> SampledTurn``."""

MIN_TURN_TOKENS = 256
"""A turn is sampled only with room for at least this many tokens (or max_tokens_per_turn, if smaller)."""


@dataclass(frozen=True)
class ConversationLimits:
    """Caps of one attempt's conversation."""

    max_turns: int
    max_tokens_per_turn: int
    max_context_tokens: int
    max_observation_chars: int
    max_tool_calls_per_turn: int

    @classmethod
    def of(cls, config: TinkerAgentBackend) -> ConversationLimits:
        """The limits set in the agent's config."""
        return cls(
            max_turns=config.max_turns,
            max_tokens_per_turn=config.max_tokens_per_turn,
            max_context_tokens=config.context_window(),
            max_observation_chars=config.max_observation_chars,
            max_tool_calls_per_turn=config.max_tool_calls_per_turn,
        )


@dataclass
class Conversation:
    """One attempt's token sequence and what it cost."""

    tokens: list[int]
    prompt_length: int
    logprobs: list[float] = field(default_factory=list)
    sampled_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    turns: int = 0
    ended: EndReason = "turn_cap"

    def policy_sample(self) -> PolicySample:
        """The attempt as one sequence for the outer update (see the module docstring)."""
        return PolicySample(tokens=list(self.tokens), logprobs=list(self.logprobs), prompt_length=self.prompt_length)


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`, special-token markup included, without BOS/EOS added."""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def stop_token(tokenizer: Tokenizer, fmt: ChatFormat) -> int:
    """The end-of-turn token id; PermanentBackendError if the tokenizer does not have it as one token."""
    ids = encode(tokenizer, fmt.end)
    if len(ids) != 1:
        raise PermanentBackendError(f"renderer {fmt.name!r} does not fit the base model's tokenizer ({fmt.end} is {len(ids)} tokens); choose its renderer")
    return ids[0]


def turn_max_tokens(prompt_tokens: int, limits: ConversationLimits) -> int | None:
    """The next turn's max_tokens: max_tokens_per_turn capped at the context left; None when too little is left.

    One token of the context is kept for the end-of-turn token added after a reply cut at max_tokens.
    """
    room = limits.max_context_tokens - prompt_tokens - 1
    if room < min(limits.max_tokens_per_turn, MIN_TURN_TOKENS):
        return None
    return min(limits.max_tokens_per_turn, room)


def run_conversation(workspace: Workspace, fmt: ChatFormat, tokenizer: Tokenizer, sample_turn: SampleTurn, limits: ConversationLimits) -> Conversation:
    """Sample replies and run their tool calls in `workspace` until submit() succeeds or a cap is hit."""
    stop = stop_token(tokenizer, fmt)
    task_md = read_workspace_text(workspace.files_dir, TASK_FILE, workspace.limits)
    prompt = encode(tokenizer, first_prompt_text(fmt, task_md, tool_specs()))
    if turn_max_tokens(len(prompt), limits) is None:
        needed = len(prompt) + 1 + min(limits.max_tokens_per_turn, MIN_TURN_TOKENS)
        raise PermanentBackendError(
            f"the first prompt has {len(prompt)} tokens; raise backends.agent.max_context_tokens to at least {needed} (within the base model's context window)"
        )
    convo = Conversation(tokens=list(prompt), prompt_length=len(prompt))
    for turn in range(limits.max_turns):
        max_tokens = turn_max_tokens(len(convo.tokens), limits)
        if max_tokens is None:
            convo.ended = "context_cap"
            return convo
        sampled = sample_turn(list(convo.tokens), turn, (stop,), max_tokens)
        convo.turns += 1
        convo.prompt_tokens += sampled.prompt_tokens
        convo.cached_prompt_tokens += sampled.cached_prompt_tokens
        convo.sampled_tokens += len(sampled.tokens)
        convo.tokens += sampled.tokens
        convo.logprobs += [min(float(lp), 0.0) for lp in sampled.logprobs]
        reply = list(sampled.tokens)
        finished = bool(reply) and reply[-1] == stop
        if finished:
            reply = reply[:-1]
        else:
            convo.tokens.append(stop)  # close the turn the reply left open
            convo.logprobs.append(NOT_SAMPLED)
        parsed = parse_reply(tokenizer.decode(reply))
        results, notes = [], []
        for call in parsed.calls[: limits.max_tool_calls_per_turn]:
            result = workspace.handle(call)
            results.append(clip_observation(defang(result.to_json()), limits.max_observation_chars))
            if result.ok and result.tool == "submit":
                convo.ended = "submitted"
                return convo
        if len(parsed.calls) > limits.max_tool_calls_per_turn:
            notes.append(too_many_note(limits.max_tool_calls_per_turn, len(parsed.calls) - limits.max_tool_calls_per_turn))
        if parsed.unterminated:
            notes.append(UNTERMINATED_NOTE)
        elif not parsed.calls:
            notes.append(NO_CALL_NOTE)
        if not finished:
            notes.append(cut_note(max_tokens))
        observation = encode(tokenizer, observation_text(fmt, results, notes))
        if len(convo.tokens) + len(observation) > limits.max_context_tokens:
            convo.ended = "context_cap"
            return convo
        convo.tokens += observation
        convo.logprobs += [NOT_SAMPLED] * len(observation)
    convo.ended = "turn_cap"
    return convo


# ---------------------------------------------------------------------------------------------
# costs and seeds


def agent_costs(
    config: TinkerAgentBackend, run_id: str, episode_id: int, attempt: int, prompt_tokens: int, sampled_tokens: int, cached_prompt_tokens: int = 0
) -> list[CostItem]:
    """Ledger charges of one attempt: prefilled prompt tokens (prefix-cache hits at the cached price) and sampled tokens."""
    if not 0 <= cached_prompt_tokens <= prompt_tokens:
        raise ValueError(f"{cached_prompt_tokens} cached prompt tokens of {prompt_tokens} prompt tokens")
    base = f"tinker:agent:{run_id}:{episode_id}:{attempt}"
    charges = [
        ("prompt", "prompt tokens", prompt_tokens - cached_prompt_tokens, config.usd_per_million_prompt_tokens),
        ("cached_prompt", "cached prompt tokens", cached_prompt_tokens, config.usd_per_million_cached_prompt_tokens),
        ("sample", "sampled tokens", sampled_tokens, config.usd_per_million_sample_tokens),
    ]
    return [
        CostItem(
            source="tinker",
            description=f"Tinker {what} ({config.base_model})",
            quantity=quantity,
            unit="token",
            unit_price_usd=usd_per_million / 1e6,
            key=f"{base}:{kind}",
        )
        for kind, what, quantity, usd_per_million in charges
        if quantity
    ]


def turn_seed(episode_seed: int, attempt: int, turn: int) -> int:
    """The sampling seed of one turn (reproducible per episode, attempt and turn)."""
    digest = hashlib.sha256(f"tinker:{episode_seed}:{attempt}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# the backend


class TinkerAgent:
    """Runs one attempt: a multi-turn tool-calling conversation sampled from the episode's policy version."""

    name = "tinker"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> TinkerAgent:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.agent, TinkerAgentBackend))

    def __init__(self, config: TinkerAgentBackend, connect_to: Callable[[], TinkerGateway] | None = None):
        self.config = config
        self._connect = connect_to or (lambda: connect(config.base_url, config.timeout_s))

    def __repr__(self) -> str:
        return f"TinkerAgent(base_model={self.config.base_model!r}, renderer={self.config.renderer!r})"

    def run_attempt(self, ctx: EpisodeContext, baseline: Callable[[str], float] | None = None) -> AgentSubmission:
        """Sample a conversation in the attempt's workspace and return the submission, its sample and its costs."""
        from metarl.backends.local.agent import workspace_root

        ref = TinkerPolicyRef.parse(ctx.policy_state_uri)
        if ref.base_model != self.config.base_model:
            raise PermanentBackendError(
                f"policy version {ctx.policy_version} is a LoRA of {ref.base_model}, not backends.agent.base_model {self.config.base_model}"
            )
        gateway = self._connect()
        sampler = gateway.sampling_client(ref.sampler_path)
        tokenizer = gateway.tokenizer(sampler, ref.base_model)
        workspace = Workspace(workspace_root(ctx), ctx.task, feedback=ctx.feedback, baseline=baseline, train_seconds=ctx.train_seconds)

        def sample_turn(prompt: list[int], turn: int, stop: tuple[int, ...], max_tokens: int) -> SampledTurn:
            return gateway.sample(
                sampler,
                prompt,
                max_tokens=max_tokens,
                temperature=self.config.temperature,
                stop=stop,
                seed=turn_seed(ctx.seed, ctx.probe_attempt, turn),
            )

        convo = run_conversation(workspace, CHAT_FORMATS[self.config.renderer], tokenizer, sample_turn, ConversationLimits.of(self.config))
        try:
            job_toml = read_workspace_text(workspace.files_dir, JOB_FILE, workspace.limits)
        except WorkspaceError:
            job_toml = ""
        log.info(
            "tinker agent: run %s episode %s attempt %s ended (%s) after %s turns, %s sampled tokens",
            ctx.run_id,
            ctx.episode_id,
            ctx.probe_attempt,
            convo.ended,
            convo.turns,
            convo.sampled_tokens,
        )
        return AgentSubmission(
            job_toml=job_toml,
            agent_tokens=convo.sampled_tokens,
            workspace_uri=str(workspace.files_dir),
            costs=agent_costs(
                self.config, ctx.run_id, ctx.episode_id, ctx.probe_attempt, convo.prompt_tokens, convo.sampled_tokens, convo.cached_prompt_tokens
            ),
            sample=convo.policy_sample(),
        )
