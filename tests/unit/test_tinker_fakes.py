"""Fakes of the Tinker network clients (ServiceClient, TrainingClient, SamplingClient) for offline tests.

They answer with the SDK's own types (`tinker.types.*` inside the SDK's `AwaitableConcurrentFuture`),
record every call in one ordered log, and can be told to fail the next request of a kind (`fail_next`:
the request is refused and the training client then refuses every later request, "poisoned"), or to
lose the answer of a request that took effect (`fail_after`: the server did it, the caller gets an
error). Each saved state records the state its client started from and the optim steps since
(`FakeService.origin`), so a test can count the Adam steps in each published version. The tests in
this file hold the fakes to the installed SDK: every call our gateway makes must bind to the real
method's signature, and every answer must be the SDK's type.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from tinker.types.request_error_category import RequestErrorCategory

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
BEHAVIOUR_LOGPROB = -0.25


class FakeTokenizer:
    """Character-level tokenizer with Qwen's chat markers as single tokens (ids 0-2; other characters 1000 + code point)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        for part in _SPLIT.split(text):
            if part in SPECIALS:
                ids.append(SPECIALS.index(part))
            else:
                ids.extend(1000 + ord(ch) for ch in part)
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return "".join(SPECIALS[t] if t < len(SPECIALS) else chr(t - 1000) for t in token_ids)


IM_END = FakeTokenizer().encode("<|im_end|>")[0]


def done(value: Any) -> AwaitableConcurrentFuture:
    """A resolved future, as the SDK returns."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return AwaitableConcurrentFuture(future)


def failed(exc: BaseException) -> AwaitableConcurrentFuture:
    """A future that raises `exc` on result()."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(exc)
    return AwaitableConcurrentFuture(future)


def server_failure(what: str) -> tinker.RequestFailedError:
    return tinker.RequestFailedError(f"{what} failed on the server", request_id="req-1", category=RequestErrorCategory.Server)


def user_failure(what: str) -> tinker.RequestFailedError:
    return tinker.RequestFailedError(f"{what} rejected: bad input", request_id="req-2", category=RequestErrorCategory.User)


def http_error(cls: type[tinker.APIStatusError], status: int, message: str) -> tinker.APIStatusError:
    """An SDK status error as its HTTP client raises it (on 127.0.0.1, never sent)."""
    return cls(message, response=httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/")), body=None)


CISPO_DEFAULT_CONFIG = {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
"""The cispo clip without a loss_fn_config (tinker-cookbook tutorials/202_loss_functions.py)."""


def server_gradients(
    loss_fn: str, config: dict[str, float] | None, new: list[float], behaviour: list[float], advantages: list[float]
) -> tuple[float, list[float]]:
    """(loss, d loss / d new logprob per target) of a built-in RL loss, as the Tinker service computes it.

    importance_sampling: -sum(r * A), r = exp(lp - sampling_lp) (the SDK's built-in loss). cispo: the clipped
    ratio is a detached coefficient on the logprob, -sum(sg(clip(r, low, high)) * A * lp)
    (tinker-cookbook tutorials/202_loss_functions.py, "Custom clipping thresholds").
    """
    ratios = [float(np.exp(n - b)) for n, b in zip(new, behaviour)]
    if loss_fn == "importance_sampling":
        return -sum(r * a for r, a in zip(ratios, advantages)), [-r * a for r, a in zip(ratios, advantages)]
    clip = {**CISPO_DEFAULT_CONFIG, **(config or {})}
    weights = [min(max(r, clip["clip_low_threshold"]), clip["clip_high_threshold"]) for r in ratios]
    return -sum(w * a * n for w, a, n in zip(weights, advantages, new)), [-w * a for w, a in zip(weights, advantages)]


@dataclass
class FakeService:
    """A fake `tinker.ServiceClient`: the subset the gateway uses, with a shared call log and saved states."""

    script: list[str] = field(default_factory=list)
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    logprob_shift: float = 0.1
    log: list[tuple] = field(default_factory=list)
    saved: dict[str, int] = field(default_factory=dict)
    origin: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    fail_next: dict[str, list[BaseException]] = field(default_factory=dict)
    fail_after: dict[str, list[BaseException]] = field(default_factory=dict)
    context_window: int | None = None
    training_clients: list[FakeTrainingClient] = field(default_factory=list)
    sampling_clients: list[FakeSamplingClient] = field(default_factory=list)
    api_key: str | None = None
    base_url: str | None = None

    def take_failure(self, what: str, failures: dict[str, list[BaseException]] | None = None) -> BaseException | None:
        queue = (self.fail_next if failures is None else failures).get(what) or []
        return queue.pop(0) if queue else None

    def _new_training(self, steps: int, loaded_from: str | None) -> FakeTrainingClient:
        client = FakeTrainingClient(self, run=f"run{len(self.training_clients)}", steps=steps, loaded_from=loaded_from, since=loaded_from)
        self.training_clients.append(client)
        return client

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict | None = None,
        optimizer: Any = None,
    ) -> AwaitableConcurrentFuture:
        self.log.append(("create_lora_training_client", base_model, rank, seed))
        return done(self._new_training(0, None))

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None, user_metadata: dict | None = None, weights_access_token: str | None = None
    ) -> AwaitableConcurrentFuture:
        self.log.append(("create_training_client_from_state_with_optimizer", path))
        if path not in self.saved:
            return failed(user_failure(f"no checkpoint {path}"))
        return done(self._new_training(self.saved[path], path))

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None, retry_config: Any = None, record_stability_info: bool = False
    ) -> AwaitableConcurrentFuture:
        self.log.append(("create_sampling_client", model_path))
        client = FakeSamplingClient(self, model_path)
        self.sampling_clients.append(client)
        return done(client)


@dataclass
class FakeTrainingClient:
    """A fake `tinker.TrainingClient`; `steps` counts the optim steps in its weights (saved with each state)."""

    service: FakeService
    run: str
    steps: int
    loaded_from: str | None
    since: str | None = None
    steps_since: int = 0
    poisoned: BaseException | None = None
    grads: list[torch.Tensor] = field(default_factory=list)

    def _refuse(self) -> AwaitableConcurrentFuture | None:
        if self.poisoned is not None:
            return failed(RuntimeError("A previous request failed; this TrainingClient is poisoned and cannot accept further requests."))
        return None

    def _maybe_fail(self, what: str) -> AwaitableConcurrentFuture | None:
        refused = self._refuse()
        if refused is not None:
            self.service.log.append((what, self.run, "refused"))
            return refused
        exc = self.service.take_failure(what)
        if exc is not None:
            self.poisoned = exc
            self.service.log.append((what, self.run, "failed"))
            return failed(exc)
        return None

    def _answer(self, what: str, value: Any) -> AwaitableConcurrentFuture:
        """The request took effect; its answer is lost when a `fail_after` failure is queued (the client is not poisoned)."""
        exc = self.service.take_failure(what, self.service.fail_after)
        if exc is not None:
            self.service.log.append((what, self.run, "answer lost"))
            return failed(exc)
        return done(value)

    def _new_logprobs(self, datum: types.Datum) -> list[float]:
        behaviour = datum.loss_fn_inputs["logprobs"].tolist()
        advantages = datum.loss_fn_inputs["advantages"].tolist()
        return [b + self.service.logprob_shift if a != 0 else -1.0 for b, a in zip(behaviour, advantages)]

    def forward_backward(self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict | None = None) -> AwaitableConcurrentFuture:
        failure = self._maybe_fail("forward_backward")
        if failure is not None:
            return failure
        assert loss_fn in ("importance_sampling", "cispo"), f"the fake computes only importance_sampling and cispo, not {loss_fn!r}"
        self.service.log.append(("forward_backward", self.run, loss_fn, list(data), loss_fn_config))
        outputs, total, self.grads = [], 0.0, []
        for datum in data:
            new = self._new_logprobs(datum)
            behaviour = datum.loss_fn_inputs["logprobs"].tolist()
            advantages = datum.loss_fn_inputs["advantages"].tolist()
            loss, grads = server_gradients(loss_fn, loss_fn_config, new, behaviour, advantages)
            total += loss
            self.grads.append(torch.tensor(grads))
            outputs.append({"logprobs": types.TensorData(data=new, dtype="float32", shape=[len(new)])})
        return self._answer(
            "forward_backward", types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": total})
        )

    def optim_step(self, optim_params: Any = None, *, adam_params: Any = None) -> AwaitableConcurrentFuture:
        failure = self._maybe_fail("optim_step")
        if failure is not None:
            return failure
        params = optim_params if optim_params is not None else adam_params
        assert isinstance(params, types.AdamParams)
        self.steps += 1
        self.steps_since += 1
        self.service.log.append(("optim_step", self.run, params))
        return self._answer("optim_step", types.OptimStepResponse(metrics={"optim/lr": params.learning_rate}))

    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False, user_metadata: dict | None = None) -> AwaitableConcurrentFuture:
        failure = self._maybe_fail("save_state")
        if failure is not None:
            return failure
        path = f"tinker://{self.run}/weights/{name}"
        self.service.saved[path] = self.steps
        self.service.origin[path] = (self.since, self.steps_since)
        self.since, self.steps_since = path, 0
        self.service.log.append(("save_state", self.run, name, ttl_seconds))
        return self._answer("save_state", types.SaveWeightsResponse(path=path))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None, user_metadata: dict | None = None) -> AwaitableConcurrentFuture:
        failure = self._maybe_fail("save_weights_for_sampler")
        if failure is not None:
            return failure
        path = f"tinker://{self.run}/sampler_weights/{name}"
        self.service.saved[path] = self.steps
        self.service.log.append(("save_weights_for_sampler", self.run, name, ttl_seconds))
        return self._answer("save_weights_for_sampler", types.SaveWeightsForSamplerResponse(path=path))

    def get_tokenizer(self) -> FakeTokenizer:
        return self.service.tokenizer


@dataclass
class FakeSamplingClient:
    """A fake `tinker.SamplingClient` answering with the service's scripted replies, in order.

    It checks that every prompt extends the previous prompt and the reply sampled from it (one
    growing sequence per conversation); a prompt that does not starts a new conversation.
    """

    service: FakeService
    model_path: str | None
    prompts: list[list[int]] = field(default_factory=list)
    params: list[types.SamplingParams] = field(default_factory=list)
    last: list[int] | None = None

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: Any = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> AwaitableConcurrentFuture:
        assert isinstance(prompt, types.ModelInput) and isinstance(sampling_params, types.SamplingParams) and num_samples == 1
        tokens = prompt.to_ints()
        self.prompts.append(tokens)
        self.params.append(sampling_params)
        exc = self.service.take_failure("sample")
        if exc is not None:
            return failed(exc)
        window = self.service.context_window
        if window is not None and len(tokens) + (sampling_params.max_tokens or 0) > window:
            # the service refuses a prompt plus max_tokens beyond the model's window (tinker-cookbook 0.6.1
            # tinker_cookbook/completers.py caps max_tokens to avoid exactly this error)
            return failed(http_error(tinker.BadRequestError, 400, f"prompt ({len(tokens)}) + max_tokens exceeds context window ({window})"))
        self.service.log.append(("sample", self.model_path, len(tokens)))
        assert self.service.script, "the fake sampling client ran out of scripted replies"
        text = self.service.script.pop(0)
        reply = self.service.tokenizer.encode(text) + [IM_END]
        stop_reason = "stop"
        if sampling_params.max_tokens is not None and len(reply) > sampling_params.max_tokens:
            reply, stop_reason = reply[: sampling_params.max_tokens], "length"
        cached = 0
        for earlier, now in zip(self.last or [], tokens):
            if earlier != now:
                break
            cached += 1
        self.last = tokens + reply
        sequence = types.SampledSequence(
            stop_reason=stop_reason,
            sequence_id=f"seq-{len(self.prompts)}",
            tokens_np=np.array(reply, dtype=np.int32),
            logprobs_np=np.full(len(reply), BEHAVIOUR_LOGPROB, dtype=np.float32),
        )
        # the conversation so far is a prefix-cache hit (tinker types/sample_response.py `prompt_cache_hit_tokens`)
        return done(types.SampleResponse(sequences=[sequence], prompt_cache_hit_tokens=cached))

    def get_tokenizer(self) -> FakeTokenizer:
        return self.service.tokenizer


def extends(prompts: list[list[int]], service: FakeService) -> bool:
    """Every prompt starts with the previous prompt plus the reply sampled from it."""
    replies = []
    tok = service.tokenizer
    for earlier, later in zip(prompts, prompts[1:]):
        if later[: len(earlier)] != earlier:
            return False
        replies.append(later[len(earlier) :])
    return all(tok.decode(r).count("<|im_start|>assistant") == 1 for r in replies)


# ---------------------------------------------------------------------------------------------
# the fakes are held to the installed SDK

GATEWAY_CALLS = [
    (tinker.ServiceClient, "create_lora_training_client", (), {"base_model": "Qwen/Qwen3-30B-A3B", "rank": 8, "seed": 0}),
    (tinker.ServiceClient, "create_training_client_from_state_with_optimizer", ("tinker://r/weights/v1",), {}),
    (tinker.ServiceClient, "create_sampling_client", (), {"model_path": "tinker://r/sampler_weights/v1"}),
    (tinker.TrainingClient, "forward_backward", ([],), {"loss_fn": "cispo", "loss_fn_config": {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}}),
    (tinker.TrainingClient, "optim_step", (types.AdamParams(learning_rate=1e-4),), {}),
    (tinker.TrainingClient, "save_state", ("v1",), {"ttl_seconds": 604_800}),
    (tinker.TrainingClient, "save_weights_for_sampler", ("v1",), {"ttl_seconds": None}),
    (tinker.SamplingClient, "sample", (), {"prompt": types.ModelInput.from_ints([1]), "num_samples": 1, "sampling_params": types.SamplingParams()}),
    (tinker.SamplingClient, "get_tokenizer", (), {}),
]
FAKE_OF = {tinker.ServiceClient: FakeService, tinker.TrainingClient: FakeTrainingClient, tinker.SamplingClient: FakeSamplingClient}


@pytest.mark.parametrize(("cls", "method", "args", "kwargs"), GATEWAY_CALLS, ids=[f"{c.__name__}.{m}" for c, m, _, _ in GATEWAY_CALLS])
def test_every_call_the_gateway_makes_binds_to_the_real_sdk_and_the_fake(cls: type, method: str, args: tuple, kwargs: dict) -> None:
    inspect.signature(getattr(cls, method)).bind(None, *args, **kwargs)
    inspect.signature(getattr(FAKE_OF[cls], method)).bind(None, *args, **kwargs)


def test_the_fakes_answer_with_the_sdks_types() -> None:
    service = FakeService(script=["hello"])
    training = service.create_lora_training_client(base_model="m", rank=8, seed=0).result(timeout=1)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": [2, 3], "logprobs": [0.0, -0.5], "advantages": [0.0, 1.0]},
    )
    backward = training.forward_backward([datum], loss_fn="importance_sampling")
    assert isinstance(backward, tinker.APIFuture)
    assert isinstance(backward.result(timeout=1), types.ForwardBackwardOutput)
    assert isinstance(training.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=1), types.OptimStepResponse)
    assert isinstance(training.save_state("v1").result(timeout=1), types.SaveWeightsResponse)
    assert isinstance(training.save_weights_for_sampler("v1").result(timeout=1), types.SaveWeightsForSamplerResponse)
    sampler = service.create_sampling_client(model_path="tinker://run0/sampler_weights/v1").result(timeout=1)
    response = sampler.sample(prompt=types.ModelInput.from_ints([5]), num_samples=1, sampling_params=types.SamplingParams(max_tokens=50)).result(timeout=1)
    assert isinstance(response, types.SampleResponse) and isinstance(response.sequences[0], types.SampledSequence)
    assert response.sequences[0].tokens[-1] == IM_END and len(response.sequences[0].logprobs) == len(response.sequences[0].tokens)


def test_a_failed_fake_training_client_is_poisoned_like_the_real_one() -> None:
    service = FakeService(fail_next={"optim_step": [server_failure("optim_step")]})
    training = service.create_lora_training_client(base_model="m").result(timeout=1)
    with pytest.raises(tinker.RequestFailedError):
        training.optim_step(types.AdamParams()).result(timeout=1)
    with pytest.raises(RuntimeError, match="poisoned"):
        training.save_state("v1").result(timeout=1)


def test_fake_tokenizer_round_trips_and_keeps_markers_single() -> None:
    tok = FakeTokenizer()
    text = "<|im_start|>user\nhé <tool_call>{}</tool_call><|im_end|>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [IM_END]


def test_the_losses_the_fake_computes_are_sdk_loss_names_and_cispo_clips_the_weight_without_zeroing_it() -> None:
    from typing import get_args

    from tinker.types.loss_fn_type import LossFnType

    assert {"importance_sampling", "cispo"} <= set(get_args(LossFnType))
    # ratios e^1.5 (past the high clip 2) with advantages -1 and +1, and e^-3 (below any low clip but 0)
    new, behaviour = [-1.0, -1.0, -4.0], [-2.5, -2.5, -1.0]
    loss, grads = server_gradients("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}, new, behaviour, [-1.0, 1.0, 1.0])
    assert grads == pytest.approx([2.0, -2.0, -math.exp(-3.0)])
    assert loss == pytest.approx(-(2.0 * -1.0 * -1.0 + 2.0 * 1.0 * -1.0 + math.exp(-3.0) * -4.0))
    assert server_gradients("cispo", None, [0.0], [-2.0], [1.0])[1] == pytest.approx([-4.0])  # the default high clip is 4
    assert server_gradients("importance_sampling", None, [0.0], [-2.0], [1.0])[1] == pytest.approx([-math.exp(2.0)])


def test_a_lost_answer_took_effect_and_does_not_poison_the_fake_client() -> None:
    service = FakeService(fail_after={"optim_step": [RuntimeError("answer lost")]})
    training = service.create_lora_training_client(base_model="m").result(timeout=1)
    with pytest.raises(RuntimeError, match="answer lost"):
        training.optim_step(types.AdamParams()).result(timeout=1)
    path = training.save_state("v1").result(timeout=1).path
    assert service.saved[path] == 1 and service.origin[path] == (None, 1)
    again = service.create_training_client_from_state_with_optimizer(path).result(timeout=1)
    again.optim_step(types.AdamParams()).result(timeout=1)
    second = again.save_state("v2").result(timeout=1).path
    assert service.saved[second] == 2 and service.origin[second] == (path, 1)
