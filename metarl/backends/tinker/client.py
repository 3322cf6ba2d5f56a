"""Every call to the Tinker service, in one module (docs/backends.md, "Tinker: the trainer agent as an LLM").

The backends (`metarl.backends.tinker.agent`, `metarl.backends.tinker.outer`) talk to Tinker only
through :class:`TinkerGateway`, which wraps a `tinker.ServiceClient` (or, in tests, a fake with the
same methods) and turns SDK errors into :mod:`metarl.errors` classes where they arise:

- auth, billing, permission, other 4xx answers, an SDK/server schema mismatch, and a request the
  server marks as the user's fault: :class:`PermanentBackendError`;
- the statuses the SDK itself retries (408, 409, 429, 5xx; :data:`TRANSIENT_HTTP_STATUSES`) when
  they outlast its retries, lost connections, timeouts, and failed requests of the server's making:
  :class:`TransientBackendError`.

Secrets: the API key is read from ``TINKER_API_KEY`` when a connection is made and handed straight
to the SDK; nothing here stores it, logs it or shows it in a repr, and every error text passes
through :func:`redact` first.

Importing this module never imports the SDK and never touches the network.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.backends.tinker.config import TINKER_API_KEY_ENV
from metarl.errors import PermanentBackendError, TransientBackendError, bounded_text
from schemas.base import printable
from schemas.urls import redacted_url

log = logging.getLogger("metarl.tinker")

MAX_ERROR_CHARS = 300
SAMPLER_CACHE_SIZE = 4
CHECKPOINT_NAME = re.compile(r"[^A-Za-z0-9_\-]")
TRANSIENT_HTTP_STATUSES = frozenset({408, 409, 429})
"""4xx statuses the SDK retries as transient, like every 5xx (tinker 0.38 lib/retry_handler.py `is_retryable_status_code`)."""


def transient_status(status_code: int) -> bool:
    """True for an HTTP status worth retrying: 408 (timeout), 409 (lock timeout), 429 and 5xx."""
    return status_code in TRANSIENT_HTTP_STATUSES or status_code >= 500


def api_key_from_env() -> str:
    """The Tinker API key from ``TINKER_API_KEY``; PermanentBackendError naming the variable (never a value) if unset."""
    key = os.environ.get(TINKER_API_KEY_ENV, "").strip()
    if not key:
        raise PermanentBackendError(f"{TINKER_API_KEY_ENV} is not set: export the Tinker API key in the environment of every agent and outer worker")
    return key


TINKER_KEY_PREFIXES = ("tml-", "eyJ")
"""What a Tinker credential starts with: an API key or a JWT (tinker 0.38 lib/_auth_token_provider.py `ApiKeyAuthProvider`)."""


def key_format_problem(key: str) -> str | None:
    """Why the SDK would refuse this key before sending anything (None: it would not); never shows the key."""
    if key.startswith(TINKER_KEY_PREFIXES):
        return None
    return f"{TINKER_API_KEY_ENV} does not start with 'tml-', so it is not a Tinker API key: export the key the Tinker console gives"


def redact(text: str) -> str:
    """The text with the API key (if it is set and occurs) replaced by ``***``, made printable and bounded."""
    key = os.environ.get(TINKER_API_KEY_ENV, "").strip()
    if len(key) >= 4:
        text = text.replace(key, "***")
    return bounded_text(printable(text), MAX_ERROR_CHARS)


@contextmanager
def classified(what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Turn the SDK's errors raised inside the block into TransientBackendError or PermanentBackendError.

    The original exception is not chained: SDK errors carry the request, and its headers the key.
    """
    import tinker
    from tinker.types.request_error_category import RequestErrorCategory

    try:
        yield
    except (tinker.AuthenticationError, tinker.PermissionDeniedError, tinker.BillingError) as exc:
        raise PermanentBackendError(f"tinker {what}: {type(exc).__name__} (HTTP {exc.status_code}); check {TINKER_API_KEY_ENV} and the account") from None
    except (tinker.RateLimitError, tinker.InternalServerError, tinker.APIConnectionError) as exc:
        raise TransientBackendError(f"tinker {what}: {type(exc).__name__}: {redact(str(exc))}") from None
    except tinker.APIStatusError as exc:
        kind = TransientBackendError if transient_status(exc.status_code) else PermanentBackendError
        raise kind(f"tinker {what}: {type(exc).__name__} (HTTP {exc.status_code}): {redact(str(exc))}") from None
    except tinker.APIResponseValidationError as exc:
        raise PermanentBackendError(f"tinker {what}: the answer does not match the installed SDK ({type(exc).__name__}); upgrade tinker") from None
    except tinker.RequestFailedError as exc:
        kind = PermanentBackendError if exc.category == RequestErrorCategory.User else TransientBackendError
        raise kind(f"tinker {what} failed ({exc.category.value}): {redact(exc.message)}") from None
    except tinker.TinkerError as exc:
        raise TransientBackendError(f"tinker {what}: {type(exc).__name__}: {redact(str(exc))}") from None
    except TimeoutError:
        raise TransientBackendError(f"tinker {what}: no answer within {timeout_s} s") from None


# ---------------------------------------------------------------------------------------------
# where a policy version lives


class TinkerPolicyRef(BaseModel):
    """One policy version on Tinker: its training state (weights and Adam moments) and its sampler weights.

    Stored as JSON in ``policy_versions.state_uri``; the sampler weights are saved before the
    version is published, so every episode samples from a known, fixed snapshot.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tinker"] = Field(default="tinker", description="Marks a Tinker policy reference")
    base_model: str = Field(min_length=1, max_length=200, description="Base model of the LoRA")
    version: int = Field(ge=0, le=10**9, description="Policy version")
    state_path: str = Field(min_length=10, max_length=1500, pattern=r"^tinker://\S+$", description="save_state path (resume with optimizer)")
    sampler_path: str = Field(min_length=10, max_length=1500, pattern=r"^tinker://\S+$", description="save_weights_for_sampler path (sampling)")

    def encode(self) -> str:
        """Compact JSON for the state_uri column."""
        return self.model_dump_json()

    @classmethod
    def parse(cls, text: str | None) -> TinkerPolicyRef:
        """Parse a state_uri; PermanentBackendError when it is missing or not a Tinker reference."""
        if text is None:
            raise PermanentBackendError("the policy version has no saved state; a tinker run saves version 0 when it starts")
        try:
            return cls.model_validate(json.loads(text))
        except (ValueError, ValidationError):
            raise PermanentBackendError("the policy state is not a Tinker policy reference (was this run started with another outer backend?)") from None

    def at_version(self, version: int) -> TinkerPolicyRef:
        """The same weights published as another version (an update that took no step)."""
        return self.model_copy(update={"version": version})


def checkpoint_name(run_id: str, version: int) -> str:
    """Name of a version's saved state and sampler weights: letters, digits, `-` and `_` only."""
    return CHECKPOINT_NAME.sub("-", f"metarl-{run_id}-v{version:05d}")


# ---------------------------------------------------------------------------------------------
# results in plain Python types


@dataclass(frozen=True)
class SampledTurn:
    """One sampled reply: its tokens, their behaviour logprobs, why it stopped, and the prompt it was sampled from."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: str
    prompt_tokens: int
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class StepOutput:
    """What one forward_backward + optim_step returned: per-datum new logprobs (if given) and metrics."""

    logprobs: list[list[float]] | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class SavedWeights:
    """Paths of one version's training state and sampler weights."""

    state_path: str
    sampler_path: str


@dataclass
class HeldTrainingClient:
    """A training client this process holds for a run: its weights and Adam state equal the saved state at `state_path`.

    Registered only after a complete update (or the initial save), and taken out of the gateway before
    the next request is sent to it, so a client that may have stepped is never used again.
    """

    client: Any
    version: int
    state_path: str


@dataclass(frozen=True)
class AdamSettings:
    """The Adam step's hyperparameters (Tinker's AdamParams)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


# ---------------------------------------------------------------------------------------------
# the gateway


@dataclass
class TinkerGateway:
    """The only object that calls Tinker; wraps a ServiceClient (real, or a fake with the same methods).

    It also keeps what a worker process reuses between tasks: sampling clients by sampler path,
    tokenizers by base model, and the training client of each run (:class:`HeldTrainingClient`).
    """

    service: Any = field(repr=False)
    timeout_s: float = 900.0
    samplers: OrderedDict[str, Any] = field(default_factory=OrderedDict, repr=False)
    tokenizers: dict[str, Any] = field(default_factory=dict, repr=False)
    training_clients: dict[str, HeldTrainingClient] = field(default_factory=dict, repr=False)

    # -- training --

    def create_lora_training_client(self, base_model: str, rank: int, seed: int | None) -> Any:
        """A new LoRA training client on `base_model` (a new Tinker training run)."""
        with classified("create_lora_training_client", self.timeout_s):
            return self.service.create_lora_training_client(base_model=base_model, rank=rank, seed=seed).result(timeout=self.timeout_s)

    def training_client_from_state(self, state_path: str) -> Any:
        """A fresh training client with the weights and Adam state saved at `state_path`."""
        with classified("create_training_client_from_state_with_optimizer", self.timeout_s):
            return self.service.create_training_client_from_state_with_optimizer(state_path).result(timeout=self.timeout_s)

    def train_step(self, training: Any, datums: Sequence[Any], loss_fn: str, loss_fn_config: dict[str, float], adam: AdamSettings) -> StepOutput:
        """forward_backward with a built-in loss and its config, then one Adam optim_step (both submitted before waiting)."""
        from tinker import types

        params = types.AdamParams(**asdict(adam))
        with classified("forward_backward", self.timeout_s):
            backward = training.forward_backward(list(datums), loss_fn=loss_fn, loss_fn_config=dict(loss_fn_config))
            step = training.optim_step(params)
            output = backward.result(timeout=self.timeout_s)
            optim = step.result(timeout=self.timeout_s)
        return _step_output(output, optim)

    def save(self, training: Any, name: str, ttl_s: int | None) -> SavedWeights:
        """save_state (to resume training) and save_weights_for_sampler (to sample) under one name."""
        with classified("save_state", self.timeout_s):
            state = training.save_state(name, ttl_seconds=ttl_s)
            sampler = training.save_weights_for_sampler(name, ttl_seconds=ttl_s)
            state_path = state.result(timeout=self.timeout_s).path
            sampler_path = sampler.result(timeout=self.timeout_s).path
        return SavedWeights(state_path=state_path, sampler_path=sampler_path)

    # -- sampling --

    def sampling_client(self, sampler_path: str) -> Any:
        """A sampling client on the fixed sampler weights at `sampler_path` (cached per process)."""
        if sampler_path in self.samplers:
            self.samplers.move_to_end(sampler_path)
            return self.samplers[sampler_path]
        with classified("create_sampling_client", self.timeout_s):
            client = self.service.create_sampling_client(model_path=sampler_path).result(timeout=self.timeout_s)
        self.samplers[sampler_path] = client
        while len(self.samplers) > SAMPLER_CACHE_SIZE:
            self.samplers.popitem(last=False)
        return client

    def tokenizer(self, sampler: Any, base_model: str) -> Any:
        """The base model's tokenizer (the SDK loads it from the model's files; cached per process)."""
        if base_model not in self.tokenizers:
            with classified("get_tokenizer", self.timeout_s):
                self.tokenizers[base_model] = sampler.get_tokenizer()
        return self.tokenizers[base_model]

    def sample(self, sampler: Any, prompt: Sequence[int], *, max_tokens: int, temperature: float, stop: Sequence[int], seed: int | None) -> SampledTurn:
        """One completion of `prompt` with its per-token behaviour logprobs."""
        from tinker import types

        params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=list(stop), seed=seed)
        with classified("sample", self.timeout_s):
            response = sampler.sample(prompt=types.ModelInput.from_ints(list(prompt)), num_samples=1, sampling_params=params).result(timeout=self.timeout_s)
        if not response.sequences:
            raise TransientBackendError("tinker sample: the answer holds no sequence")
        sequence = response.sequences[0]
        tokens = [int(t) for t in sequence.tokens]
        logprobs = sequence.logprobs
        if logprobs is None or len(logprobs) != len(tokens):
            raise PermanentBackendError("tinker sample: the answer has no logprob for every sampled token; the outer update needs them")
        return SampledTurn(
            tokens=tuple(tokens),
            logprobs=tuple(float(x) for x in logprobs),
            stop_reason=str(sequence.stop_reason),
            prompt_tokens=len(prompt),
            cached_prompt_tokens=min(int(response.prompt_cache_hit_tokens or 0), len(prompt)),
        )


def _step_output(output: Any, optim: Any) -> StepOutput:
    """Plain lists and floats from a ForwardBackwardOutput and an OptimStepResponse."""
    records = [record.get("logprobs") for record in output.loss_fn_outputs]
    logprobs = None if any(values is None for values in records) else [[float(x) for x in values.tolist()] for values in records]
    metrics = {f"tinker_{key}": float(value) for key, value in (output.metrics or {}).items()}
    metrics.update({f"tinker_optim_{key}": float(value) for key, value in (getattr(optim, "metrics", None) or {}).items()})
    return StepOutput(logprobs=logprobs, metrics=metrics)


_SERVICES: dict[str | None, Any] = {}
_GATEWAYS: dict[tuple[str | None, float], TinkerGateway] = {}


def connect(base_url: str | None, timeout_s: float) -> TinkerGateway:
    """The process's gateway to Tinker at `base_url` (one ServiceClient per URL; the key from the environment)."""
    key = api_key_from_env()
    gateway = _GATEWAYS.get((base_url, timeout_s))
    if gateway is None:
        service = _SERVICES.get(base_url)
        if service is None:
            import tinker

            problem = key_format_problem(key)
            if problem is not None:
                raise PermanentBackendError(problem)
            service = tinker.ServiceClient(api_key=key, base_url=base_url)
            _SERVICES[base_url] = service
            log.info("tinker: connected (base_url=%s)", redacted_url(base_url) if base_url else "SDK default")
        gateway = TinkerGateway(service=service, timeout_s=timeout_s)
        _GATEWAYS[(base_url, timeout_s)] = gateway
    return gateway
