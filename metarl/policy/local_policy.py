"""A small torch policy over the job language (the `local` policy backend's trainer agent).

Embedding + one-layer GRU + linear head (~29k parameters), sampled under the job grammar so every
sample is a syntactically complete job. Sampling is deterministic given a seed (each row draws
from its own generator, by inverse CDF), and the log-probabilities it returns are those of the
distribution actually sampled (grammar-masked, at the sampling temperature): the behaviour
log-probabilities that importance-sampling GRPO needs.

The untrained policy leans toward `default` tokens (a bias on the head) and slightly toward the
smaller model, so it starts with mostly default jobs, a share of invalid ones, and room to learn.
State is saved as tensors and plain values only (`torch.save`, loaded with `weights_only=True`).
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from metarl.policy import job_language as jl
from metarl.policy.job_limits import JobLimits

STATE_FORMAT = "metarl-local-policy-v1"


@dataclass(frozen=True)
class PolicyConfig:
    """Size and initial leanings of the local policy."""

    embed_dim: int = 32
    hidden_dim: int = 64
    init_seed: int = 0
    default_bias: float = 3.0  # initial logit bonus of `default` tokens (~75% default per slot)
    small_model_bias: float = 0.3  # initial logit bonus of the smaller model (~43% pick the larger)
    reward_end_bias: float = 1.5  # initial logit bonus of closing the reward table early
    head_init_std: float = 0.02


@dataclass(frozen=True)
class SampledJob:
    """One sampled sequence: context + job tokens, behaviour log-probabilities of the job tokens."""

    tokens: list[int]
    logprobs: list[float]
    prompt_length: int
    temperature: float = 1.0

    @property
    def prompt_tokens(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def job_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def render(self, seed: int | None = None, limits: JobLimits | None = None) -> str:
        """The job.toml text of this sample (its dataset moved into `limits` when given)."""
        return jl.render_job_toml(self.job_tokens, seed=seed, limits=limits)


class TargetScores(NamedTuple):
    """What the update needs of the policy at each target: its log-probability and the policy's entropy there."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


class _Net(nn.Module):
    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.embed = nn.Embedding(jl.VOCAB_SIZE, config.embed_dim)
        self.gru = nn.GRU(config.embed_dim, config.hidden_dim, batch_first=True)
        self.head = nn.Linear(config.hidden_dim, jl.VOCAB_SIZE)


@lru_cache(maxsize=8192)
def _state_mask(state: jl.GrammarState) -> torch.Tensor:
    """Allowed tokens of a grammar state (a complete job allows only padding); cached, never written to."""
    mask = torch.zeros(jl.VOCAB_SIZE, dtype=torch.bool)
    mask[list(state.allowed()) if not state.complete else [jl.PAD_ID]] = True
    return mask


def mixed_logprobs(logits: torch.Tensor, masks: torch.Tensor, floor: float) -> torch.Tensor:
    """Log-probabilities of softmax(logits) over the allowed tokens, mixed with `floor` of the uniform over them.

    The exploration floor: every allowed token keeps at least floor / (allowed tokens) of probability,
    whatever the weights say. Disallowed tokens get -inf. floor 0 is the plain masked softmax.
    """
    logprobs = torch.log_softmax(logits.masked_fill(~masks, float("-inf")), dim=-1)
    if floor <= 0.0:
        return logprobs
    uniform = -torch.log(masks.sum(dim=-1, keepdim=True).clamp(min=1).float())
    finite = torch.where(masks, logprobs, torch.zeros_like(logprobs))  # no -inf into logaddexp: its gradient there is NaN
    mixed = torch.logaddexp(finite + math.log1p(-floor), uniform + math.log(floor))
    return mixed.masked_fill(~masks, float("-inf"))


def grammar_masks(full_tokens: Sequence[int], n_targets: int) -> torch.Tensor:
    """Allowed-token masks [n_targets, V] for the targets `full_tokens[1:]` (all True at prompt targets).

    Raises ValueError when a job token is not allowed by the grammar.
    """
    masks = torch.ones(n_targets, jl.VOCAB_SIZE, dtype=torch.bool)
    tokens = [int(t) for t in full_tokens]
    if jl.SEP_ID not in tokens:
        return masks
    sep = tokens.index(jl.SEP_ID)
    state = jl.GrammarState(rules=jl.context_rules(tokens[: sep + 1]))
    for position in range(sep + 1, min(len(tokens), n_targets + 1)):
        masks[position - 1] = _state_mask(state)
        state = state.advance(tokens[position])
    return masks


class LocalPolicy:
    """The trainer-agent policy of the `local` backend."""

    def __init__(self, config: PolicyConfig | None = None):
        self.config = config or PolicyConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.init_seed)
            self.net = _Net(self.config)
            nn.init.normal_(self.net.head.weight, std=self.config.head_init_std)
        with torch.no_grad():
            bias = torch.zeros(jl.VOCAB_SIZE)
            bias[list(jl.DEFAULT_TOKEN_IDS)] = self.config.default_bias
            bias[jl.TOKEN_ID[jl.MODEL_SLOT.token(jl.MODELS[0])]] = self.config.small_model_bias
            bias[jl.TOKEN_ID[jl.REWARD_END]] = self.config.reward_end_bias
            self.net.head.bias.copy_(bias)
        self.optimizer: torch.optim.Adam | None = None
        self.replay: list[list[dict[str, list]]] = []
        """The datums of the latest outer steps (newest batch first, each datum a dict of plain lists), kept in the state so
        the next step can train on them again (metarl/backends/local/agent.py `LocalOuter.update`)."""

    # -- parameters and optimiser ----------------------------------------------------------------

    def parameters(self) -> list[nn.Parameter]:
        return list(self.net.parameters())

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    def make_optimizer(self, lr: float = 1e-3) -> torch.optim.Adam:
        """The policy's Adam optimiser (created once; later calls return the same one)."""
        if self.optimizer is None:
            self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        return self.optimizer

    # -- sampling --------------------------------------------------------------------------------

    def _encode_contexts(self, contexts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(last output [B, H], hidden [1, B, H]) after reading each context."""
        lengths = torch.tensor([len(c) for c in contexts], dtype=torch.long)
        if int(lengths.min()) < 1:
            raise ValueError("a context must hold at least one token")
        padded = torch.full((len(contexts), int(lengths.max())), jl.PAD_ID, dtype=torch.long)
        for row, context in enumerate(contexts):
            padded[row, : len(context)] = torch.tensor([int(t) for t in context], dtype=torch.long)
        packed = nn.utils.rnn.pack_padded_sequence(self.net.embed(padded), lengths, batch_first=True, enforce_sorted=False)
        _, hidden = self.net.gru(packed)
        return hidden[0], hidden

    @torch.no_grad()
    def sample_batch(self, contexts: Sequence[Sequence[int]], seeds: Sequence[int], temperature: float = 1.0, floor: float = 0.0) -> list[SampledJob]:
        """One grammatical job per context; row i is deterministic given seeds[i]. `floor` is the exploration floor (`mixed_logprobs`)."""
        if len(contexts) != len(seeds):
            raise ValueError("one seed per context")
        if not temperature > 0:
            raise ValueError("temperature must be > 0")
        if not contexts:
            return []
        for context in contexts:
            if not context or int(context[-1]) != jl.SEP_ID or jl.SEP_ID in [int(t) for t in context[:-1]]:
                raise ValueError("a context must end with its only <sep> token (see job_language.context_tokens)")
        # Each row draws all its uniforms from its own generator up front: a row's sample depends
        # only on its seed (and the weights), never on the other rows of the batch.
        uniforms = torch.stack([torch.rand(jl.MAX_JOB_LENGTH, generator=torch.Generator().manual_seed(int(seed) % 2**63)) for seed in seeds])
        output, hidden = self._encode_contexts(contexts)
        states = [jl.GrammarState(rules=jl.context_rules(context)) for context in contexts]
        jobs: list[list[int]] = [[] for _ in contexts]
        logps: list[list[float]] = [[] for _ in contexts]
        for step in range(jl.MAX_JOB_LENGTH):
            if all(state.complete for state in states):
                break
            masks = torch.stack([_state_mask(state) for state in states])
            logprobs = mixed_logprobs(self.net.head(output) / temperature, masks, floor)
            cdf = torch.cumsum(logprobs.exp(), dim=-1)
            u = uniforms[:, step : step + 1] * cdf[:, -1:]
            picked = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=jl.VOCAB_SIZE - 1)
            picked_list = picked.tolist()
            for row, state in enumerate(states):
                if state.complete:
                    picked_list[row] = jl.PAD_ID
                    continue
                token = picked_list[row]
                if not masks[row, token]:
                    token = max(state.allowed())  # rounding at the top of the CDF
                    picked_list[row] = token
                jobs[row].append(token)
                states[row] = state.advance(token)
            next_tokens = torch.tensor(picked_list, dtype=torch.long)
            step_logps = logprobs.gather(1, next_tokens.unsqueeze(1)).squeeze(1).tolist()
            for row, job in enumerate(jobs):
                if len(job) == step + 1:
                    logps[row].append(step_logps[row])
            step_out, hidden = self.net.gru(self.net.embed(next_tokens).unsqueeze(1), hidden)
            output = step_out[:, 0]
        return [
            SampledJob(tokens=[int(t) for t in context] + job, logprobs=lp, prompt_length=len(context), temperature=float(temperature))
            for context, job, lp in zip(contexts, jobs, logps)
        ]

    def sample(self, context_tokens: Sequence[int], seed: int, temperature: float = 1.0, floor: float = 0.0) -> SampledJob:
        """One grammatical job for a context, deterministic given the seed."""
        return self.sample_batch([context_tokens], [seed], temperature, floor)[0]

    # -- training --------------------------------------------------------------------------------

    def target_logprobs(
        self, inputs: torch.Tensor, targets: torch.Tensor, lengths: Sequence[int], temperature: float = 1.0, floor: float = 0.0
    ) -> torch.Tensor:
        """Log-probabilities [B, T] of `targets` given `inputs` (Tinker's model_input/target_tokens layout); see `target_scores`."""
        return self.target_scores(inputs, targets, lengths, temperature, floor).logprobs

    def target_scores(self, inputs: torch.Tensor, targets: torch.Tensor, lengths: Sequence[int], temperature: float = 1.0, floor: float = 0.0) -> TargetScores:
        """Log-probabilities [B, T] of `targets` given `inputs`, and the policy's entropy [B, T] at each job target.

        Row b holds `lengths[b]` valid positions (right padding). Targets that are job tokens
        (after `<sep>`) are scored under the grammar mask and exploration floor, as they were sampled;
        prompt targets are scored unmasked (they carry advantage 0). The entropy is that of the
        policy's own grammar-masked softmax (before the floor mixes in the uniform), 0 at prompt
        targets and padding. Padding positions return logprob 0.
        """
        if inputs.shape != targets.shape or inputs.dim() != 2:
            raise ValueError("inputs and targets must both be [batch, time]")
        batch, width = inputs.shape
        masks = torch.ones(batch, width, jl.VOCAB_SIZE, dtype=torch.bool)
        valid = torch.zeros(batch, width, dtype=torch.bool)
        for row, length in enumerate(lengths):
            length = int(length)
            if not 1 <= length <= width:
                raise ValueError(f"row {row} has length {length} outside [1, {width}]")
            full = inputs[row, :length].tolist() + [int(targets[row, length - 1])]
            masks[row, :length] = grammar_masks(full, length)
            valid[row, :length] = True
        output, _ = self.net.gru(self.net.embed(inputs.clamp(0, jl.VOCAB_SIZE - 1)))
        job_positions = ~masks.all(dim=-1, keepdim=True)
        logits = self.net.head(output) / temperature
        plain = torch.log_softmax(logits.masked_fill(~masks, float("-inf")), dim=-1)
        logprobs = torch.where(job_positions, mixed_logprobs(logits, masks, floor), plain) if floor > 0.0 else plain
        picked = logprobs.gather(-1, targets.clamp(0, jl.VOCAB_SIZE - 1).unsqueeze(-1)).squeeze(-1)
        finite = torch.where(masks, plain, torch.zeros_like(plain))  # 0 * -inf would be NaN
        entropy = -(finite.exp() * finite).sum(dim=-1)
        on_job = valid & job_positions.squeeze(-1)
        return TargetScores(torch.where(valid, picked, torch.zeros_like(picked)), torch.where(on_job, entropy, torch.zeros_like(entropy)))

    def logprobs(self, context_tokens: Sequence[int], job_tokens: Sequence[int], temperature: float = 1.0, floor: float = 0.0) -> torch.Tensor:
        """Log-probabilities [len(job_tokens)] of a job given its context (differentiable)."""
        full = [int(t) for t in context_tokens] + [int(t) for t in job_tokens]
        if not job_tokens:
            return torch.zeros(0)
        inputs = torch.tensor([full[:-1]], dtype=torch.long)
        targets = torch.tensor([full[1:]], dtype=torch.long)
        out = self.target_logprobs(inputs, targets, [len(full) - 1], temperature, floor)[0]
        return out[len(context_tokens) - 1 :]

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Tensors and plain values only (loadable with `torch.load(weights_only=True)`)."""
        return {
            "format": STATE_FORMAT,
            "config": asdict(self.config),
            "vocab": list(jl.VOCAB),
            "model": {key: value.detach().clone() for key, value in self.net.state_dict().items()},
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "replay": self.replay,
        }

    def save_state(self, path: str | os.PathLike) -> None:
        """Write model, Adam state and replay batches to `path` atomically (temp file + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".policy-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(self.state_dict(), handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_state(self, path: str | os.PathLike) -> None:
        """Load model, Adam state and replay batches saved by `save_state` (weights_only; the vocabulary must match: ValueError naming the file)."""
        self._apply(_read_payload(path, self.config))

    def _apply(self, payload: dict) -> None:
        """Weights, Adam state and replay batches (none in a state saved before they were kept) of a payload `_read_payload`
        checked against this policy's sizes."""
        self.net.load_state_dict(payload["model"])
        if payload.get("optimizer") is not None:
            self.make_optimizer().load_state_dict(payload["optimizer"])
        self.replay = list(payload.get("replay") or [])

    @classmethod
    def from_state(cls, path: str | os.PathLike) -> LocalPolicy:
        """A policy of the saved sizes and prior with the saved weights and Adam state (the file read once)."""
        payload = _read_payload(path)
        policy = cls(PolicyConfig(**payload["config"]))
        policy._apply(payload)  # its sizes are the saved ones
        return policy


def _read_payload(path: str | os.PathLike, config: PolicyConfig | None = None) -> dict:
    """The saved state at `path` (weights_only), ValueError naming the file when it cannot be this code's policy."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    problem = payload_problem(payload, config)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return payload


def payload_problem(payload: object, config: PolicyConfig | None = None) -> str | None:
    """Why a loaded state cannot be this code's policy (None: it can): not a local policy state, another job-language
    vocabulary, or (given `config`) other embed/hidden sizes."""
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        return f"not a local policy state ({STATE_FORMAT})"
    if payload.get("vocab") != list(jl.VOCAB):
        saved = payload.get("vocab") or []
        added, removed = len(set(jl.VOCAB) - set(saved)), len(set(saved) - set(jl.VOCAB))
        return f"saved with a different job-language vocabulary ({len(saved)} tokens; this code has {len(jl.VOCAB)}: {added} added, {removed} removed)"
    if config is None:
        return None
    saved_config = PolicyConfig(**payload["config"])
    if (saved_config.embed_dim, saved_config.hidden_dim) != (config.embed_dim, config.hidden_dim):
        return f"saved with embed/hidden {saved_config.embed_dim}/{saved_config.hidden_dim}, this policy has {config.embed_dim}/{config.hidden_dim}"
    return None


def state_file_problem(path: str | os.PathLike) -> str | None:
    """Why the saved state at `path` cannot be loaded by this code (None: it can)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        return f"cannot be read ({err})"
    return payload_problem(payload)
