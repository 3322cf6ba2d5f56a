"""The `tinker` outer update: GRPO of the trainer agent's LoRA on Tinker with a clipped importance weight.

One update per outer step, with the datums of :mod:`metarl.outer_update` (``build_datum`` and
``to_tinker_datum``: input = tokens[:-1], targets = tokens[1:], behaviour logprobs and advantages
aligned to the targets, zero at prompt positions):

1. group-relative advantages per group (``group_advantages``); a datum per sampled attempt; positions
   the policy did not sample (tool results in a multi-turn attempt, marked by
   :data:`metarl.backends.tinker.agent.NOT_SAMPLED`) get advantage 0 like the prompt; datums whose
   advantage is 0 everywhere are left out (they carry no gradient, only cost);
2. ``forward_backward`` with Tinker's built-in ``cispo`` loss, ``loss_fn_config`` = clip_low_threshold 0,
   clip_high_threshold ``outer.ratio_cap``: the gradient of a target's logprob is
   ``-min(r, ratio_cap) * adv`` (r = exp(lp - sampling_lp)), the importance weight clipped, never zeroed,
   so a token whose probability grew past the cap with a negative advantage is still pushed down. It is
   the local backend's loss (:func:`metarl.outer_update.importance_sampling_loss`), with no extra forward
   pass. Why this form: the untruncated ``importance_sampling`` is unstable on stale data (tinker-cookbook
   0.6.1 ``tinker_cookbook/rl/train.py`` warns so for off-policy training), and ours is up to
   ``outer.max_steps_off_policy`` versions old; CISPO's clipped ratio is a detached coefficient on the
   logprob, which "never zeros a token's gradient — it only bounds the coefficient's magnitude", and its
   one-sided clip (no lower bound) is the form the cookbook calls safe off-policy
   (tinker-cookbook ``tutorials/202_loss_functions.py``). The cookbook's async trainer trains groups of
   any staleness; we drop those past ``outer.max_steps_off_policy`` (``filter_stale``);
3. ``optim_step`` with Adam at ``outer.learning_rate``;
4. ``save_state`` (weights and Adam moments) and ``save_weights_for_sampler`` under the new version's
   name, each expiring after ``checkpoint_ttl_s`` (the last version's after ``final_checkpoint_ttl_s``);
   only then is the version returned, so it is saved before any episode samples from it.

Exactly once. A published version is one Adam step on the previous published version's saved state:

- a training client is registered in the process (:class:`metarl.backends.tinker.client.HeldTrainingClient`)
  only after a complete update, with the state path it equals, and it is taken out of the registry
  before the next update sends it anything. Whatever fails after that (a Tinker error, an error in our
  metrics, a time limit, the SDK's plain ``RuntimeError`` from a blocked client, any exception), the
  client that may have stepped is no longer registered, and no later update can step it again;
- an update that finds no held client, or one whose state is not its base version's, starts from the
  base version's saved state (``create_training_client_from_state_with_optimizer``); so does a worker
  that restarts, and every in-update recovery after a transient failure (at most ``max_recoveries``
  times; after that the error goes to the worker, which retries the step with backoff).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from metarl.backends.tinker.agent import is_sampled
from metarl.backends.tinker.client import AdamSettings, HeldTrainingClient, TinkerGateway, TinkerPolicyRef, checkpoint_name, connect
from metarl.backends.tinker.config import TinkerAgentBackend, TinkerOuterBackend
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import BackendServices, CostItem, OuterBatchEpisode, OuterResult, PolicySample
from schemas.backend_config import expect_config
from schemas.run_config import RunConfig

if TYPE_CHECKING:
    from metarl.outer_update import Datum

log = logging.getLogger("metarl.tinker.outer")

LOSS_FN = "cispo"


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
    from metarl.domain.advantages import group_advantages

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


def loss_config(ratio_cap: float) -> dict[str, float]:
    """The cispo loss's clip: no lower bound, the importance weight capped at `ratio_cap` (Tinker's loss_fn_config keys)."""
    return {"clip_low_threshold": 0.0, "clip_high_threshold": float(ratio_cap)}


def checkpoint_ttl(config: TinkerOuterBackend, version: int, max_outer_steps: int) -> int | None:
    """Expiry in seconds of a version's saved state and sampler weights: the run's last version has its own."""
    return config.saved_state_ttl(version, max_outer_steps)


def train_costs(config: TinkerOuterBackend, run_id: str, step: int, tokens: int, passes: int) -> list[CostItem]:
    """The ledger charge of one update: every token sent through the model (once per attempt), at the configured train price."""
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
    """One clipped-weight GRPO step of the Tinker LoRA per outer step; each version saved before it is used, stepped exactly once."""

    name = "tinker"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> TinkerOuter:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.outer, TinkerOuterBackend), expect_config(config.backends.agent, TinkerAgentBackend))

    def __init__(self, config: TinkerOuterBackend, agent: TinkerAgentBackend, connect_to: Callable[[], TinkerGateway] | None = None):
        self.config = config
        self.agent = agent
        self._connect = connect_to or (lambda: connect(config.base_url, config.timeout_s))

    def __repr__(self) -> str:
        return f"TinkerOuter(base_model={self.agent.base_model!r}, lora_rank={self.config.lora_rank}, loss={self.config.loss!r})"

    def initial_state(self, run_id: str, config: RunConfig) -> str:
        """Version 0: a fresh LoRA (equal to the base model), its training state and sampler weights saved."""
        gateway = self._connect()
        gateway.training_clients.pop(run_id, None)
        training = gateway.create_lora_training_client(self.agent.base_model, self.config.lora_rank, seed=config.run.seed)
        saved = gateway.save(training, checkpoint_name(run_id, 0), checkpoint_ttl(self.config, 0, config.run.max_outer_steps))
        gateway.training_clients[run_id] = HeldTrainingClient(client=training, version=0, state_path=saved.state_path)
        log.info("tinker outer: run %s version 0 saved", run_id)
        return TinkerPolicyRef(base_model=self.agent.base_model, version=0, state_path=saved.state_path, sampler_path=saved.sampler_path).encode()

    @staticmethod
    def _take_held_client(gateway: TinkerGateway, run_id: str, ref: TinkerPolicyRef) -> Any | None:
        """The run's held client, taken out of the registry; None unless its weights are the base version's saved state."""
        held = gateway.training_clients.pop(run_id, None)
        return held.client if held is not None and held.state_path == ref.state_path else None

    def update(self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None) -> OuterResult:
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
        adam = AdamSettings(
            learning_rate=config.outer.learning_rate,
            beta1=self.config.adam_beta1,
            beta2=self.config.adam_beta2,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
            grad_clip_norm=self.config.grad_clip_norm,
        )
        ttl = checkpoint_ttl(self.config, version, config.run.max_outer_steps)
        gateway = self._connect()
        # From here until the end no client of this run is registered: an exception anywhere drops the one in use.
        training = self._take_held_client(gateway, run_id, ref)
        attempts = 0
        while True:
            attempts += 1
            try:
                if training is None:
                    training = gateway.training_client_from_state(ref.state_path)
                output = gateway.train_step(training, tinker_datums, LOSS_FN, loss_config(config.outer.ratio_cap), adam)
                saved = gateway.save(training, checkpoint_name(run_id, version), ttl)
            except TransientBackendError as err:
                training = None  # poisoned, or stepped already: it is never sent another request
                if attempts > self.config.max_recoveries:
                    raise
                log.warning("tinker outer step %s (run %s): %s; recreating the training client from version %s", step, run_id, err, ref.version)
                continue
            break
        if output.logprobs is not None:
            metrics.update(ratio_metrics(datums, output.logprobs, config.outer.ratio_cap))
        metrics.update(output.metrics)
        metrics.update({"skipped": 0.0, "recoveries": float(attempts - 1), "tokens_sent": float(tokens)})
        new_ref = TinkerPolicyRef(base_model=ref.base_model, version=version, state_path=saved.state_path, sampler_path=saved.sampler_path)
        result = OuterResult(state_uri=new_ref.encode(), metrics=metrics, costs=train_costs(self.config, run_id, step, tokens, attempts))
        gateway.training_clients[run_id] = HeldTrainingClient(client=training, version=version, state_path=saved.state_path)
        log.info("tinker outer: run %s step %s saved version %s (%s datums)", run_id, step, version, len(datums))
        return result
