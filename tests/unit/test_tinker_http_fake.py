"""The fake Tinker service (tests/fakes/tinker_server.py) held to the installed SDK: the real `tinker.ServiceClient` talks
to it over HTTP on 127.0.0.1 and gets the SDK's own types back, through the SDK directly and through metarl's gateway
(metarl/backends/tinker/client.py); a wrong key is refused as the SDK's AuthenticationError, which the gateway makes a
PermanentBackendError; the tokenizer comes from a local folder with the hub offline.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types

from metarl.backends.tinker import client as tinker_client
from metarl.backends.tinker.agent import CHAT_FORMATS, stop_token
from metarl.backends.tinker.client import AdamSettings, TinkerGateway, classified
from metarl.errors import PermanentBackendError
from tests.fakes.tinker_server import (
    FakeTinker,
    SampleTurn,
    conversation_turn,
    scripted,
    token_logprob,
    write_chat_tokenizer,
)

KEY = f"tml-FAKESECRET-{uuid.uuid4().hex}"
BASE_MODEL = "Qwen/Qwen3-8B"
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_tokenizer(tmp_path_factory.mktemp("tinker") / "chat-tokenizer")


@pytest.fixture
def fake(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTinker]:
    """The fake, answering each future after two try-agains; the hub offline, the key in the environment."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    replies = scripted(lambda seed: f"reply one (seed {seed})", lambda seed: "reply two")
    with FakeTinker(KEY, tokenizer_dir, replies, polls_before_result=2) as running:
        yield running
    assert running.errors == []


@pytest.fixture
def service(fake: FakeTinker) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(api_key=KEY, base_url=fake.url)
    yield client
    client.close("success").result(timeout=TIMEOUT_S)


def datum(tokens: list[int], advantage: float) -> types.Datum:
    """A datum of the shape metarl/outer_update.py `to_tinker_datum` builds: targets, behaviour logprobs, advantages."""
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
            "logprobs": types.TensorData(data=[-0.3] * n, dtype="float32", shape=[n]),
            "advantages": types.TensorData(data=[advantage] * n, dtype="float32", shape=[n]),
        },
    )


def test_the_real_sdk_round_trips_through_the_fake_and_gets_its_own_types(fake: FakeTinker, service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result(timeout=TIMEOUT_S)
    assert isinstance(training, tinker.TrainingClient)
    assert training.get_info().model_data.model_name == BASE_MODEL and training.get_info().lora_rank == 8

    backward = training.forward_backward([datum([5, 6, 7, 8], 1.0)], loss_fn="cispo", loss_fn_config={"clip_low_threshold": 0.0, "clip_high_threshold": 2.0})
    step = training.optim_step(types.AdamParams(learning_rate=1e-4))
    output, optim = backward.result(timeout=TIMEOUT_S), step.result(timeout=TIMEOUT_S)
    assert isinstance(output, types.ForwardBackwardOutput) and isinstance(optim, types.OptimStepResponse)
    assert output.loss_fn_outputs[0]["logprobs"].tolist() == pytest.approx([token_logprob(t, 0) for t in (6, 7, 8)])
    assert set(output.metrics) == {"loss:sum"}

    state = training.save_state("v1", ttl_seconds=7200).result(timeout=TIMEOUT_S)
    sampler_weights = training.save_weights_for_sampler("v1").result(timeout=TIMEOUT_S)
    assert isinstance(state, types.SaveWeightsResponse) and isinstance(sampler_weights, types.SaveWeightsForSamplerResponse)
    assert state.path.startswith("tinker://") and "/weights/" in state.path and "/sampler_weights/" in sampler_weights.path

    resumed = service.create_training_client_from_state_with_optimizer(state.path).result(timeout=TIMEOUT_S)
    assert isinstance(resumed, tinker.TrainingClient) and resumed.model_id != training.model_id
    resumed.forward_backward([datum([5, 6, 7], -1.0)], loss_fn="importance_sampling")
    resumed.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=TIMEOUT_S)
    again = resumed.save_state("v2").result(timeout=TIMEOUT_S)
    saved_first, saved_again = fake.saved_state(state.path), fake.saved_state(again.path)
    assert saved_first is not None and saved_first.steps == 1 and saved_first.ttl_seconds == 7200
    assert saved_again is not None and saved_again.steps == 2  # the loaded state goes on counting

    sampler = service.create_sampling_client(model_path=sampler_weights.path).result(timeout=TIMEOUT_S)
    assert isinstance(sampler, tinker.SamplingClient)
    tokenizer = sampler.get_tokenizer()
    end = stop_token(tokenizer, CHAT_FORMATS["qwen3"])
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    params = types.SamplingParams(max_tokens=100, temperature=1.0, stop=[end], seed=11)
    response = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=params).result(timeout=TIMEOUT_S)
    assert isinstance(response, types.SampleResponse) and isinstance(response.sequences[0], types.SampledSequence)
    sequence = response.sequences[0]
    assert tokenizer.decode(sequence.tokens) == "reply one (seed 11)<|im_end|>" and sequence.stop_reason == "stop"
    assert sequence.logprobs == pytest.approx([token_logprob(t, 1) for t in sequence.tokens])  # the sampler weights hold one step
    assert sequence.sequence_id is not None

    cut = types.SamplingParams(max_tokens=3, stop=[end])
    follow_up = prompt + list(sequence.tokens) + tokenizer.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    second = sampler.sample(prompt=types.ModelInput.from_ints(follow_up), num_samples=1, sampling_params=cut).result(timeout=TIMEOUT_S)
    assert tokenizer.decode(second.sequences[0].tokens) == "rep" and second.sequences[0].stop_reason == "length"
    assert second.prompt_cache_hit_tokens == len(prompt) + len(sequence.tokens)

    assert fake.ops["retrieve_future"] >= 3 * fake.ops["optim_step"]  # two try-agains, then the result
    assert fake.ops["client/config"] == 1 and fake.ops["create_session"] == 1 and fake.auth_failures == 0


def test_metarls_gateway_steps_saves_and_samples_against_the_fake(fake: FakeTinker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tinker_client, "_SERVICES", {})
    monkeypatch.setattr(tinker_client, "_GATEWAYS", {})
    gateway = tinker_client.connect(fake.url, TIMEOUT_S)
    try:
        training = gateway.create_lora_training_client(BASE_MODEL, rank=8, seed=0)
        output = gateway.train_step(training, [datum([1, 2, 3], 1.0)], "cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}, AdamSettings(1e-4))
        assert output.logprobs == [pytest.approx([token_logprob(t, 0) for t in (2, 3)])] and "tinker_loss:sum" in output.metrics
        saved = gateway.save(training, "metarl-run-v00001", ttl_s=None)
        sampler = gateway.sampling_client(saved.sampler_path)
        tokenizer = gateway.tokenizer(sampler, BASE_MODEL)
        end = stop_token(tokenizer, CHAT_FORMATS["qwen3"])
        prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        turn = gateway.sample(sampler, prompt, max_tokens=50, temperature=1.0, stop=(end,), seed=3)
        assert tokenizer.decode(list(turn.tokens)) == "reply one (seed 3)<|im_end|>" and turn.stop_reason == "stop"
        assert turn.logprobs == pytest.approx([token_logprob(t, 1) for t in turn.tokens])
    finally:
        gateway.service.close("success").result(timeout=TIMEOUT_S)


def test_a_wrong_key_is_refused_as_an_authentication_error_and_the_gateway_makes_it_permanent(fake: FakeTinker) -> None:
    gateway = TinkerGateway(service=tinker.ServiceClient(api_key="tml-wrong-key", base_url=fake.url), timeout_s=TIMEOUT_S)
    with pytest.raises(PermanentBackendError, match="AuthenticationError"):
        gateway.create_lora_training_client(BASE_MODEL, rank=8, seed=0)
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(api_key="tml-wrong-key", base_url=fake.url).create_lora_training_client(base_model=BASE_MODEL)
    assert fake.auth_failures == 2 and fake.ops["create_session"] == 0


def test_the_fakes_refusals_reach_the_caller_as_the_sdks_errors(fake: FakeTinker, service: tinker.ServiceClient) -> None:
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint"):
        service.create_training_client_from_state_with_optimizer("tinker://nowhere/weights/v1").result(timeout=TIMEOUT_S)
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result(timeout=TIMEOUT_S)
    with pytest.raises(tinker.RequestFailedError, match="computes only"):
        training.forward_backward([datum([1, 2], 1.0)], loss_fn="ppo").result(timeout=TIMEOUT_S)
    with pytest.raises(PermanentBackendError, match="failed \\(user\\)"):
        with classified("save_state"):
            service.create_lora_training_client(base_model=BASE_MODEL).result(timeout=TIMEOUT_S).save_state("v1", ttl_seconds=60).result(timeout=TIMEOUT_S)


def test_the_tokenizer_keeps_the_chat_markers_single_and_round_trips_any_text(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = '<|im_start|>user\nhé ∑ <tool_call>\n{"a": 1}\n</tool_call><|im_end|>\n'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert [len(tokenizer.encode(marker, add_special_tokens=False)) for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")] == [1, 1, 1]


def test_script_turns_follow_the_assistant_headers() -> None:
    first = "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    second = first + "r<|im_end|>\n<|im_start|>user\no<|im_end|>\n<|im_start|>assistant\n"
    assert (conversation_turn(first), conversation_turn(second)) == (0, 1)
    script = scripted(lambda seed: f"a{seed}", lambda seed: "b")
    assert script(SampleTurn(first, 0, 4)) == "a4" and script(SampleTurn(second, 1, None)) == "b"


def test_the_fake_stops_cleanly(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake = FakeTinker(KEY, tokenizer_dir, scripted()).start()
    client = tinker.ServiceClient(api_key=KEY, base_url=fake.url)
    client.create_lora_training_client(base_model=BASE_MODEL).result(timeout=TIMEOUT_S)
    client.close("success").result(timeout=TIMEOUT_S)
    port = int(fake.url.rsplit(":", 1)[1])
    fake.stop()
    assert fake.errors == [] and fake.ops["finish"] == 1
    assert not any(thread.name == "fake-tinker-http" for thread in threading.enumerate())
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    fake.stop()  # a second stop is a no-op


def test_a_key_the_sdk_would_refuse_is_a_permanent_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from metarl.backends.tinker import client as tinker_client
    from metarl.errors import PermanentBackendError

    monkeypatch.setattr(tinker_client, "_SERVICES", {})
    monkeypatch.setattr(tinker_client, "_GATEWAYS", {})
    monkeypatch.setenv("TINKER_API_KEY", "sk-not-a-tinker-key-0123")
    with pytest.raises(PermanentBackendError, match="TINKER_API_KEY does not start with 'tml-'") as caught:
        tinker_client.connect("http://127.0.0.1:9", 5.0)
    assert "sk-not-a-tinker-key" not in str(caught.value)
    assert tinker_client.key_format_problem("tml-abc") is None and tinker_client.key_format_problem("eyJhbGciOi") is None
