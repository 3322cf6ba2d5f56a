"""The `tinker` outer update: importance-sampling GRPO of the trainer agent's LoRA on Tinker.

One update per outer step, with the datums of :mod:`metarl.outer_update` (``build_datum`` and
``to_tinker_datum``: input = tokens[:-1], targets = tokens[1:], behaviour logprobs and advantages
aligned to the targets, zero at prompt positions):

1. group-relative advantages per group (``group_advantages``); a datum per sampled attempt; positions
   the policy did not sample (tool results in a multi-turn attempt, marked by
   :data:`metarl.backends.tinker_agent.NOT_SAMPLED`) get advantage 0 like the prompt; datums whose
   advantage is 0 everywhere are left out (they carry no gradient, only cost);
2. ``forward_backward`` with Tinker's ``importance_sampling`` loss (``-(exp(lp - sampling_lp) * adv).sum()``,
   ratio not truncated; the staleness bound limits it), or, with ``loss = "truncated_importance_sampling"``,
   ``forward_backward_custom`` with :func:`metarl.outer_update.importance_sampling_loss` truncated at
   ``outer.ratio_cap`` (the local backend's loss exactly; one extra forward pass);
3. ``optim_step`` with Adam at ``outer.learning_rate``;
4. ``save_state`` (weights and Adam moments) and ``save_weights_for_sampler`` under the new version's
   name; only then is the version returned, so it is saved before any episode samples from it.

A request that fails poisons a training client (it refuses every later request), so after any
transient failure the client is dropped and a fresh one is made from the last saved state
(``create_training_client_from_state_with_optimizer``) and the whole step is run again, at most
``max_recoveries`` times; after that the error goes to the worker, which retries the step with
backoff. A worker that restarts does the same from the base version's saved state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from metarl.backends.base import CostItem, OuterBatchEpisode, OuterResult, PolicySample
from metarl.backends.tinker_agent import is_sampled
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.tinker_client import AdamSettings, HeldTrainingClient, TinkerGateway, TinkerPolicyRef, checkpoint_name, connect
from schemas.run_config import RunConfig, TinkerAgentBackend, TinkerOuterBackend

if TYPE_CHECKING:
    from metarl.outer_update import Datum

log = logging.getLogger("metarl.tinker.outer")

BUILTIN_LOSS = "importance_sampling"


# ---------------------------------------------------------------------------------------------
# datums (pure)


def sample_datum(sample: PolicySample, advantage: float) -> Datum | None:
    """The datum of one sampled attempt, or None when it would carry no gradient.

    A single-turn sample is exactly ``build_datum(prompt, completion, logprobs, advantage)``. In a
    multi-turn sample the positions marked NOT_SAMPLED get behaviour logprob 0, advantage 0 and mask 0.
    """
    from metarl.outer_update import Datum, build_datum

    prompt, rest = list(sample.tokens[: sample.prompt_length]), list(sample.tokens[sample.prompt_length :])
    if len(sample.logprobs) != len(rest):
        raise ValueError(f"{len(sample.logprobs)} logprobs for {len(rest)} tokens after the prompt")
    if not all(math.isfinite(x) for x in sample.logprobs):
        raise ValueError("behaviour logprobs must be finite")
    sampled = [is_sampled(x) for x in sample.logprobs]
    if advantage == 0 or not any(sampled):
        return None
    if all(sampled):
        return build_datum(prompt, rest, sample.logprobs, advantage)
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    tokens, pad = prompt + rest, [0.0] * (len(prompt) - 1)
    return Datum(
        model_input=tokens[:-1],
        target_tokens=tokens[1:],
        logprobs=pad + [x if s else 0.0 for x, s in zip(sample.logprobs, sampled)],
        advantages=pad + [float(advantage) if s else 0.0 for s in sampled],
        mask=pad + [1.0 if s else 0.0 for s in sampled],
    )


def batch_datums(batch: Sequence[OuterBatchEpisode], normalize_std: bool) -> list[Datum]:
    """Datums of an outer batch: group-relative advantages per group, one datum per sampled attempt with signal."""
    from metarl.outer_update import group_advantages

    groups: dict[int, list[OuterBatchEpisode]] = {}
    for episode in batch:
        groups.setdefault(episode.group_id, []).append(episode)
    advantages = group_advantages([[e.reward for e in members] for members in groups.values()], normalize_std=normalize_std)
    datums = []
    for members, group_advantage in zip(groups.values(), advantages):
        for episode, advantage in zip(members, group_advantage):
            for sample in episode.samples:
                datum = sample_datum(sample, advantage)
                if datum is not None:
                    datums.append(datum)
    return datums


def ratio_metrics(datums: Sequence[Datum], new_logprobs: Sequence[Sequence[float]], ratio_cap: float | None) -> dict[str, float]:
    """Importance-ratio statistics over the trained positions (mask 1), from the logprobs Tinker returned."""
    import torch

    from metarl.outer_update import importance_sampling_loss

    if len(new_logprobs) != len(datums):
        raise ValueError(f"{len(new_logprobs)} logprob rows for {len(datums)} datums")
    new = torch.tensor([x for row in new_logprobs for x in row], dtype=torch.float64)
    behaviour = torch.tensor([x for d in datums for x in d.logprobs], dtype=torch.float64)
    advantages = torch.tensor([x for d in datums for x in d.advantages], dtype=torch.float64)
    mask = torch.tensor([x for d in datums for x in d.mask], dtype=torch.float64)
    if new.shape != behaviour.shape:
        raise ValueError("Tinker returned logprobs of another length than the datums")
    _, stats = importance_sampling_loss(new, behaviour, advantages, mask, ratio_cap)
    return stats


def truncated_loss(ratio_cap: float, stats_out: dict[str, float]) -> Callable[[list[Any], list[Any]], tuple[Any, dict[str, float]]]:
    """A forward_backward_custom loss: the local backend's truncated importance-sampling loss over all datums.

    Positions with advantage 0 (prompt, tool results) are masked out; the ratio statistics of the
    step are written into `stats_out`.
    """

    def loss(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        import torch

        from metarl.outer_update import importance_sampling_loss

        if len(data) != len(logprobs):
            raise ValueError(f"{len(logprobs)} logprob rows for {len(data)} datums")
        new = torch.cat([row.flatten() for row in logprobs])
        behaviour = torch.cat([torch.tensor(d.loss_fn_inputs["logprobs"].tolist(), dtype=new.dtype) for d in data])
        advantages = torch.cat([torch.tensor(d.loss_fn_inputs["advantages"].tolist(), dtype=new.dtype) for d in data])
        value, stats = importance_sampling_loss(new, behaviour, advantages, (advantages != 0).to(new.dtype), ratio_cap)
        stats_out.clear()
        stats_out.update(stats)
        return value, {"truncated_is_loss": float(value.detach())}

    return loss


def train_costs(config: TinkerOuterBackend, run_id: str, step: int, tokens: int, passes: int) -> list[CostItem]:
    """The ledger charge of one update: every token sent through the model, at the configured train price."""
    if tokens * passes <= 0:
        return []
    return [
        CostItem(
            source="tinker",
            description=f"Tinker training tokens, outer step {step} ({passes} pass(es) over {tokens} tokens)",
            quantity=tokens * passes,
            unit="token",
            unit_price_usd=config.usd_per_million_train_tokens / 1e6,
            key=f"tinker:outer:{run_id}:{step}:train",
        )
    ]


# ---------------------------------------------------------------------------------------------
# the backend


class TinkerOuter:
    """One importance-sampling GRPO step of the Tinker LoRA per outer step; each version saved before it is used."""

    name = "tinker"
    simulated = False

    def __init__(self, config: TinkerOuterBackend, agent: TinkerAgentBackend, connect_to: Callable[[], TinkerGateway] | None = None):
        self.config = config
        self.agent = agent
        self._connect = connect_to or (lambda: connect(config.base_url, config.timeout_s))

    def __repr__(self) -> str:
        return f"TinkerOuter(base_model={self.agent.base_model!r}, lora_rank={self.config.lora_rank}, loss={self.config.loss!r})"

    def initial_state(self, run_id: str, config: RunConfig) -> str:
        """Version 0: a fresh LoRA (equal to the base model), its training state and sampler weights saved."""
        gateway = self._connect()
        training = gateway.create_lora_training_client(self.agent.base_model, self.config.lora_rank, seed=config.run.seed)
        saved = gateway.save(training, checkpoint_name(run_id, 0), self.config.checkpoint_ttl_s)
        gateway.training_clients[run_id] = HeldTrainingClient(client=training, version=0, state_path=saved.state_path)
        log.info("tinker outer: run %s version 0 saved", run_id)
        return TinkerPolicyRef(base_model=self.agent.base_model, version=0, state_path=saved.state_path, sampler_path=saved.sampler_path).encode()

    def _training_client(self, gateway: TinkerGateway, run_id: str, ref: TinkerPolicyRef) -> Any:
        """The held client if its weights are the base version's, else a fresh one from its saved state."""
        held = gateway.training_clients.get(run_id)
        if held is not None and held.version == ref.version and held.state_path == ref.state_path:
            return held.client
        gateway.training_clients.pop(run_id, None)
        client = gateway.training_client_from_state(ref.state_path)
        gateway.training_clients[run_id] = HeldTrainingClient(client=client, version=ref.version, state_path=ref.state_path)
        return client

    def update(
        self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None
    ) -> OuterResult:
        """Train on the batch from the base version's state and publish `version` (see the module docstring)."""
        from metarl.outer_update import to_tinker_datum

        ref = TinkerPolicyRef.parse(base_state_uri)
        if ref.version != version - 1:
            raise PermanentBackendError(f"the base state is policy version {ref.version}, but outer step {step} updates version {version - 1}")
        if ref.base_model != self.agent.base_model:
            raise PermanentBackendError(f"the run's policy is a LoRA of {ref.base_model}, not backends.agent.base_model {self.agent.base_model}")
        datums = batch_datums(batch, self.config.normalize_std)
        metrics: dict[str, float] = {"datums": float(len(datums)), "lr": float(config.outer.learning_rate), "skipped": 1.0, "recoveries": 0.0}
        if not datums:
            # nothing to learn from: publish the same weights (an Adam step without signal would still move them)
            return OuterResult(state_uri=ref.at_version(version).encode(), metrics=metrics)
        tinker_datums = [to_tinker_datum(d) for d in datums]
        tokens = sum(d.length for d in datums)
        passes = 2 if self.config.loss == "truncated_importance_sampling" else 1
        adam = AdamSettings(
            learning_rate=config.outer.learning_rate,
            beta1=self.config.adam_beta1,
            beta2=self.config.adam_beta2,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
            grad_clip_norm=self.config.grad_clip_norm,
        )
        gateway = self._connect()
        attempts = 0
        while True:
            attempts += 1
            try:
                training = self._training_client(gateway, run_id, ref)
                stats: dict[str, float] = {}
                if self.config.loss == BUILTIN_LOSS:
                    output = gateway.train_step(training, tinker_datums, BUILTIN_LOSS, adam)
                    if output.logprobs is not None:
                        stats = ratio_metrics(datums, output.logprobs, config.outer.ratio_cap)
                else:
                    output = gateway.train_step_custom(training, tinker_datums, truncated_loss(config.outer.ratio_cap, stats), adam)
                saved = gateway.save(training, checkpoint_name(run_id, version), self.config.checkpoint_ttl_s)
            except TransientBackendError as err:
                gateway.training_clients.pop(run_id, None)  # poisoned: never send it another request
                if attempts > self.config.max_recoveries:
                    raise
                log.warning("tinker outer step %s (run %s): %s; recreating the training client from version %s", step, run_id, err, ref.version)
                continue
            except PermanentBackendError:
                gateway.training_clients.pop(run_id, None)
                raise
            break
        gateway.training_clients[run_id] = HeldTrainingClient(client=training, version=version, state_path=saved.state_path)
        metrics.update(stats)
        metrics.update(output.metrics)
        metrics.update({"skipped": 0.0, "recoveries": float(attempts - 1), "tokens_sent": float(tokens)})
        new_ref = TinkerPolicyRef(base_model=ref.base_model, version=version, state_path=saved.state_path, sampler_path=saved.sampler_path)
        log.info("tinker outer: run %s step %s saved version %s (%s datums)", run_id, step, version, len(datums))
        return OuterResult(state_uri=new_ref.encode(), metrics=metrics, costs=train_costs(self.config, run_id, step, tokens, passes * attempts))
