"""A fake Tinker service on 127.0.0.1, driven through the real `tinker` SDK 0.38 (`tinker.ServiceClient(base_url=...)`).

It answers the HTTP the installed SDK sends for what metarl's gateway (metarl/backends/tinker/client.py)
calls, validating every JSON request with the SDK's own pydantic request type (``tinker.types.*``) and
building every answer from the SDK's own response type, serialized as the SDK parses it. The upstream
files each behaviour mirrors (paths inside the `tinker` package):

- the session: ``POST /api/v1/client/config`` and ``/api/v1/client/dynamic_config`` (feature flags, fetched
  before anything else), ``/api/v1/create_session``, ``/api/v1/session_heartbeat`` (every 10 s; 410 once the
  session finished), ``/api/v1/sessions/{id}/finish`` (``ServiceClient.close``) and ``/api/v1/telemetry``:
  ``lib/internal_client_holder.py``, ``lib/public_interfaces/service_client.py``, ``lib/telemetry.py``,
  ``resources/service.py``, ``resources/telemetry.py``. The flags chosen keep the SDK on its plain paths:
  API keys (no JWT exchange), httpx (no pyqwest), uncompressed fwd/bwd bodies, per-request future polls
  (``types/client_config_response.py``);
- the key: ``lib/_auth_token_provider.py`` sends it as ``X-API-Key``; any other value gets 401, which
  ``_client.py`` ``_make_status_error`` turns into ``tinker.AuthenticationError``;
- training: ``/api/v1/create_model`` (then ``/api/v1/get_info``), ``/api/v1/load_weights`` (create-via-load,
  the model id derived from session id and model seq id), ``/api/v1/forward_backward`` (a protobuf body,
  ``proto/request_conv.py``), ``/api/v1/optim_step``, ``/api/v1/save_weights``,
  ``/api/v1/save_weights_for_sampler``: ``lib/public_interfaces/training_client.py``,
  ``resources/models.py``, ``resources/training.py``, ``resources/weights.py``. Each model's requests must
  come in ``seq_id`` order (1, 2, ...), as the SDK numbers them;
- sampling: ``/api/v1/create_sampling_session``, ``GET /api/v1/samplers/{id}`` (the sampler's base model,
  from which ``SamplingClient.get_tokenizer`` loads the tokenizer), ``/api/v1/asample`` (the answer carries
  one sequence id per sample): ``lib/public_interfaces/sampling_client.py``, ``resources/sampling.py``;
- futures: every training and sampling call answers an ``UntypedAPIFuture``; ``POST /api/v1/retrieve_future``
  answers ``try_again`` ``polls_before_result`` times, then the result: JSON, or protobuf for
  ``ForwardBackwardOutput`` and ``SampleResponse`` (the SDK asks for them with ``Accept:
  application/x-protobuf`` and decodes them with ``proto/response_conv.py``), or a ``RequestFailedResponse``
  (``lib/api_future_impl.py``, ``resources/futures.py``).

The tokenizer, without the hub: ``lib/public_interfaces/sampling_client.py``
``_load_tokenizer_from_model_info(model_name, tokenizer_id)`` calls
``AutoTokenizer.from_pretrained(tokenizer_id or model_name)``; ``SamplingClient.get_tokenizer`` passes the
base model the service reports for the sampler, ``TrainingClient.get_tokenizer`` the model info's
``tokenizer_id``. So the fake reports a local tokenizer folder (:func:`write_chat_tokenizer`) as the
sampler's base model and as the model info's ``tokenizer_id``; the model info's ``model_name`` and every
saved state keep the real base model name. The folder path must not contain ``:`` and must not hold exactly
two ``/`` (that function reads ``org/model/variant`` names).

The model is a named fake, not a learner: a token's logprob comes from a small fixed table and shrinks by a
factor per optim step (:func:`token_logprob`), the weights being the count of optim steps; saved states
keep that count, so a state loaded back continues counting. The trainer agent's replies are scripted
(:class:`SampleTurn` -> text, one reply per conversation turn; :func:`scripted`). ``forward_backward``
computes the built-in ``cispo`` and ``importance_sampling`` losses only.
"""

from __future__ import annotations

import json
import math
import re
import socket
import sys
import threading
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ValidationError
from tinker import types
from tinker.proto import tinker_public_pb2 as public_pb
from tinker.proto.response_conv import _tensor_data_from_proto
from tinker.types.loss_fn_type import LossFnType
from tinker.types.request_error_category import RequestErrorCategory
from tinker.types.try_again_response import TryAgainResponse

from tests.fakes.http import QuietHandler, loopback_url

API = "/api/v1"
PROTO = "application/x-protobuf"
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen's chat markers, single special tokens of the fake tokenizer (ids 256, 257, 258 after the 256 bytes)."""
LOGPROB_TABLE = (0.05, 0.1, 0.2, 0.4, 0.8)
DECAY_PER_STEP = 0.9
MIN_TTL_S, MAX_TTL_S = 3600, 10 * 365 * 86_400
"""Checkpoint TTL bounds (tinker types/save_weights_request.py `ttl_seconds`)."""
IMPLEMENTED_LOSSES = ("cispo", "importance_sampling")
CISPO_DEFAULTS = {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
"""The cispo clip without a loss_fn_config (tinker-cookbook tutorials/202_loss_functions.py, as tests/unit/test_tinker_fakes.py)."""
CLIENT_CONFIG = types.ClientConfigResponse(
    pjwt_auth_enabled=False,
    use_pyqwest_transport=False,
    proto_compress_fwdbwd=False,
    sample_use_retrieve_futures=False,
    sample_join_sampling_session=False,
    custom_loss_server_side=False,
)


def token_logprob(token: int, steps: int) -> float:
    """The fake model's logprob of `token` after `steps` optim steps (any context)."""
    return -LOGPROB_TABLE[token % len(LOGPROB_TABLE)] * DECAY_PER_STEP**steps


def write_chat_tokenizer(folder: Path) -> Path:
    """A byte-level tokenizer (every text round-trips) with Qwen's chat markers as single special tokens,
    saved as tokenizer.json + tokenizer_config.json, which ``AutoTokenizer.from_pretrained(folder)`` loads offline."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(marker, special=True, normalized=False) for marker in CHAT_SPECIAL_TOKENS])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.save_pretrained(str(folder))
    return folder


@dataclass(frozen=True)
class SampleTurn:
    """What a scripted reply is chosen from: the decoded prompt, its turn (0 = the first reply), the request's seed."""

    prompt_text: str
    turn: int
    seed: int | None


Script = Callable[[SampleTurn], str]
"""Reply text for one sample request (the service adds the stop token)."""


class ScriptRefusal(Exception):
    """The script has no reply for this request (answered as a failed request of the user's making)."""


def scripted(*turns: Callable[[int | None], str]) -> Script:
    """A script that answers turn i of every conversation with ``turns[i](seed)``; past the last turn it refuses."""

    def reply(turn: SampleTurn) -> str:
        if not 0 <= turn.turn < len(turns):
            raise ScriptRefusal(f"the fake's script has {len(turns)} turns; this prompt asks for turn {turn.turn + 1}")
        return turns[turn.turn](turn.seed)

    return reply


def operation_of(path: str) -> str:
    """The endpoint a path names, without ids: ``optim_step``, ``client/config``, ``samplers``, ``finish``..."""
    name = path.removeprefix(API + "/").strip("/")
    if name.startswith("samplers/"):
        return "samplers"
    if name.startswith("sessions/") and name.endswith("/finish"):
        return "finish"
    return name


def conversation_turn(prompt_text: str) -> int:
    """Which reply of its conversation a prompt asks for: the assistant headers before it, less the open one."""
    return prompt_text.count("<|im_start|>assistant") - 1


@dataclass
class FakeModel:
    """One training model (a Tinker training run): its weights are the count of optim steps."""

    model_id: str
    session_id: str
    base_model: str
    lora_rank: int
    steps: int
    loaded_from: str | None = None
    last_seq_id: int = 0


@dataclass(frozen=True)
class SavedWeights:
    """A saved training state (weights and Adam moments) or sampler weights."""

    path: str
    kind: Literal["state", "sampler"]
    model_id: str
    base_model: str
    lora_rank: int
    steps: int
    ttl_seconds: int | None


@dataclass
class FakeSampler:
    """One sampling session on fixed sampler weights; `last` is its latest prompt plus reply (the prefix cache)."""

    sampler_id: str
    base_model: str
    model_path: str | None
    steps: int
    last: list[int] = field(default_factory=list)


@dataclass
class Outcome:
    """The result of one future: JSON, protobuf bytes, or a failure; answered after `polls_left` try-agains."""

    polls_left: int
    json_body: dict[str, Any] | None = None
    proto_body: bytes | None = None


class Refusal(Exception):
    """A request the fake answers with an HTTP error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RequestFailure(Exception):
    """A future that resolves to a failed request (tinker types/request_failed_response.py)."""

    def __init__(self, message: str, category: RequestErrorCategory = RequestErrorCategory.User):
        super().__init__(message)
        self.category = category


class FakeTinker:
    """The fake service. Use as a context manager or call start()/stop(); `url` is its base_url."""

    def __init__(self, api_key: str, tokenizer_dir: Path, script: Script, *, polls_before_result: int = 1, context_window: int | None = None):
        tokenizer_path = str(tokenizer_dir)
        if not tokenizer_dir.is_absolute() or ":" in tokenizer_path or tokenizer_path.count("/") == 2:
            raise ValueError(f"the tokenizer folder {tokenizer_path} must be absolute, without ':' and not exactly two '/' deep (see the module docstring)")
        self.api_key = api_key
        self.tokenizer_dir = tokenizer_dir
        self.script = script
        self.polls_before_result = polls_before_result
        self.context_window = context_window
        self.lock = threading.Lock()
        self.ops: Counter[str] = Counter()
        """Requests per endpoint (:func:`operation_of`), refused ones included."""
        self.auth_failures = 0
        self.errors: list[str] = []
        """Tracebacks of requests the fake itself failed on (a bug in the fake or a protocol it does not know)."""
        self.sessions: dict[str, bool] = {}
        """Session id -> finished."""
        self.models: dict[str, FakeModel] = {}
        self.saved: dict[str, SavedWeights] = {}
        self.samplers: dict[str, FakeSampler] = {}
        self.futures: dict[str, Outcome] = {}
        self.sample_turns: list[SampleTurn] = []
        """Every sample request as the script saw it, in order."""
        self._tokenizer: Any = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # lifecycle of the fake itself

    def __enter__(self) -> FakeTinker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeTinker:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_dir))
        fake = self

        class Handler(QuietHandler):
            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake._connections.add(self.connection)

            def finish(self) -> None:
                with fake.lock:
                    fake._connections.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                fake.errors.append(traceback.format_exc())
                print(f"fake tinker: a request failed in the fake\n{fake.errors[-1]}", file=sys.stderr)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="fake-tinker-http")
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return loopback_url(self._server)

    def stop(self) -> None:
        """Stop serving and close the connections clients keep open."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self.lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the client closed it already
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    # what tests read

    @property
    def optim_steps(self) -> int:
        with self.lock:
            return self.ops["optim_step"]

    def saved_state(self, path: str) -> SavedWeights | None:
        with self.lock:
            return self.saved.get(path)

    # HTTP

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0]
        with self.lock:
            self.ops[operation_of(path)] += 1
        if handler.headers.get("X-API-Key") != self.api_key:
            with self.lock:
                self.auth_failures += 1
            self._reply(handler, 401, {"detail": "Invalid API key"})
            return
        try:
            with self.lock:
                answer = self._route(method, path, body, handler.headers)
        except Refusal as refusal:
            self._reply(handler, refusal.status, {"detail": str(refusal)})
            return
        except ValidationError as err:
            self._reply(handler, 422, {"detail": json.loads(err.json(include_url=False))})
            return
        if isinstance(answer, bytes):
            self._send(handler, 200, PROTO, answer)
        else:
            self._reply(handler, 200, answer)

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any] | None) -> None:
        self._send(handler, status, "application/json", json.dumps(payload).encode())

    def _send(self, handler: BaseHTTPRequestHandler, status: int, content_type: str, data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, path: str, body: bytes, headers: Any) -> dict[str, Any] | bytes | None:
        """The answer to one request (called with the lock held)."""
        if method == "GET":
            match = re.fullmatch(rf"{API}/samplers/([^/]+)", path)
            if match is None:
                raise Refusal(404, f"the fake Tinker service has no GET {path}")
            sampler = self.samplers.get(match.group(1))
            if sampler is None:
                raise Refusal(404, f"no sampler {match.group(1)}")
            # the tokenizer folder as the base model: SamplingClient.get_tokenizer loads it (module docstring)
            return self._dump(types.GetSamplerResponse(sampler_id=sampler.sampler_id, base_model=str(self.tokenizer_dir), model_path=sampler.model_path))
        finish = re.fullmatch(rf"{API}/sessions/([^/]+)/finish", path)
        if finish is not None:
            reason = self._json(body).get("reason")
            if not isinstance(reason, dict) or reason.get("type") not in ("success", "errored", "interrupted"):
                raise Refusal(422, "reason.type must be success, errored or interrupted")
            self._session(finish.group(1))
            self.sessions[finish.group(1)] = True
            return None
        if path == f"{API}/forward_backward":
            return self._future(self._forward_backward, body)
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            f"{API}/client/config": self._client_config,
            f"{API}/client/dynamic_config": self._dynamic_config,
            f"{API}/create_session": self._create_session,
            f"{API}/session_heartbeat": self._heartbeat,
            f"{API}/telemetry": self._telemetry,
            f"{API}/get_info": self._get_info,
            f"{API}/create_sampling_session": self._create_sampling_session,
            f"{API}/retrieve_future": lambda request: self._retrieve(request, headers),
        }
        future_handlers: dict[str, Callable[[dict[str, Any]], tuple[str | None, BaseModel | types.SampleResponse]]] = {
            f"{API}/create_model": self._create_model,
            f"{API}/load_weights": self._load_weights,
            f"{API}/optim_step": self._optim_step,
            f"{API}/save_weights": self._save_weights,
            f"{API}/save_weights_for_sampler": self._save_weights_for_sampler,
        }
        if path in handlers:
            return handlers[path](self._json(body))
        if path in future_handlers:
            return self._future(future_handlers[path], self._json(body))
        if path == f"{API}/asample":
            return self._sample(self._json(body))
        raise Refusal(404, f"the fake Tinker service has no POST {path}")

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body or b"{}")
        except json.JSONDecodeError:
            raise Refusal(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise Refusal(400, "the body is not a JSON object")
        return data

    @staticmethod
    def _dump(model: BaseModel) -> dict[str, Any]:
        return model.model_dump(mode="json")

    # futures (lib/api_future_impl.py)

    def _future(self, work: Callable[[Any], tuple[str | None, Any]], request: Any) -> dict[str, Any]:
        """Do the work now and keep its outcome under a new request id; answer the UntypedAPIFuture."""
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        outcome = Outcome(polls_left=self.polls_before_result)
        model_id: str | None = None
        try:
            model_id, result = work(request)
        except RequestFailure as failure:
            outcome.json_body = self._dump(types.RequestFailedResponse(error=str(failure), category=failure.category))
        else:
            if isinstance(result, types.ForwardBackwardOutput):
                outcome.proto_body = forward_backward_output_proto(result)
            else:
                outcome.json_body = self._dump(result)
        self.futures[request_id] = outcome
        return self._dump(types.UntypedAPIFuture(request_id=request_id, model_id=model_id))

    def _retrieve(self, request: dict[str, Any], headers: Any) -> dict[str, Any] | bytes:
        retrieve = types.FutureRetrieveRequest.model_validate(request)
        outcome = self.futures.get(retrieve.request_id)
        if outcome is None:
            raise Refusal(404, f"no future {retrieve.request_id}")
        if outcome.polls_left > 0:
            outcome.polls_left -= 1
            return self._dump(TryAgainResponse(request_id=retrieve.request_id, queue_state="active"))
        if outcome.proto_body is not None:
            if PROTO not in (headers.get("Accept") or ""):
                raise Refusal(406, f"this result is sent as {PROTO} only")
            return outcome.proto_body
        assert outcome.json_body is not None
        return outcome.json_body

    # the session

    def _session(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise Refusal(404, f"no session {session_id}")
        if self.sessions[session_id]:
            raise Refusal(410, f"session {session_id} has finished")

    def _client_config(self, request: dict[str, Any]) -> dict[str, Any]:
        types.ClientConfigRequest.model_validate(request)
        return self._dump(CLIENT_CONFIG)

    def _dynamic_config(self, request: dict[str, Any]) -> dict[str, Any]:
        types.ClientConfigRequest.model_validate(request)
        return self._dump(types.ClientDynamicConfigResponse())

    def _create_session(self, request: dict[str, Any]) -> dict[str, Any]:
        types.CreateSessionRequest.model_validate(request)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = False
        return self._dump(types.CreateSessionResponse(session_id=session_id))

    def _heartbeat(self, request: dict[str, Any]) -> dict[str, Any]:
        self._session(types.SessionHeartbeatRequest.model_validate(request).session_id)
        return self._dump(types.SessionHeartbeatResponse())

    def _telemetry(self, request: dict[str, Any]) -> dict[str, Any]:
        types.TelemetrySendRequest.model_validate(request)
        return self._dump(types.TelemetryResponse(status="accepted"))

    # training

    def _model(self, model_id: str, seq_id: int | None) -> FakeModel:
        """The model a training request addresses; its requests come in seq_id order."""
        model = self.models.get(model_id)
        if model is None:
            raise Refusal(404, f"no model {model_id}")
        if seq_id != model.last_seq_id + 1:
            raise Refusal(400, f"seq_id {seq_id} out of order for model {model_id} (expected {model.last_seq_id + 1})")
        model.last_seq_id = seq_id
        return model

    def _create_model(self, request: dict[str, Any]) -> tuple[str, types.CreateModelResponse]:
        create = types.CreateModelRequest.model_validate(request)
        self._session(create.session_id)
        # the id the SDK derives for a model it creates by loading (lib/public_interfaces/service_client.py)
        model_id = f"{create.session_id}:train:{create.model_seq_id}"
        if model_id in self.models:
            raise Refusal(409, f"model {model_id} exists")
        rank = create.lora_config.rank if create.lora_config is not None else 0
        self.models[model_id] = FakeModel(model_id=model_id, session_id=create.session_id, base_model=create.base_model, lora_rank=rank, steps=0)
        return model_id, types.CreateModelResponse(model_id=model_id)

    def _load_weights(self, request: dict[str, Any]) -> tuple[str, types.LoadWeightsResponse]:
        load = types.LoadWeightsRequest.model_validate(request)
        if load.session_id is None or load.model_seq_id is None or load.model_id is not None:
            raise Refusal(400, "the fake implements create-via-load only (session_id and model_seq_id, no model_id)")
        self._session(load.session_id)
        model_id = f"{load.session_id}:train:{load.model_seq_id}"
        saved = self.saved.get(load.path)
        if saved is None:
            raise RequestFailure(f"no checkpoint at {load.path}")
        if load.optimizer and saved.kind != "state":
            raise RequestFailure(f"{load.path} holds sampler weights, not a training state with optimizer state")
        self.models[model_id] = FakeModel(
            model_id=model_id,
            session_id=load.session_id,
            base_model=load.base_model or saved.base_model,
            lora_rank=saved.lora_rank,
            steps=saved.steps,
            loaded_from=load.path,
        )
        return model_id, types.LoadWeightsResponse(path=load.path, model_id=model_id, type="load_weights")

    def _get_info(self, request: dict[str, Any]) -> dict[str, Any]:
        info = types.GetInfoRequest.model_validate(request)
        model = self.models.get(info.model_id)
        if model is None:
            raise Refusal(404, f"no model {info.model_id}")
        data = types.ModelData(arch="fake", model_name=model.base_model, tokenizer_id=str(self.tokenizer_dir))
        return self._dump(
            types.GetInfoResponse(
                type="get_info", model_data=data, model_id=model.model_id, is_lora=model.lora_rank > 0, lora_rank=model.lora_rank, model_name=model.base_model
            )
        )

    def _forward_backward(self, body: bytes) -> tuple[str, types.ForwardBackwardOutput]:
        request = forward_backward_request_from_proto(body)
        model = self._model(request.model_id, request.seq_id)
        config = request.forward_backward_input.loss_fn_config
        loss_fn = request.forward_backward_input.loss_fn
        if loss_fn not in IMPLEMENTED_LOSSES:
            raise RequestFailure(f"the fake computes only {', '.join(IMPLEMENTED_LOSSES)}, not {loss_fn!r}")
        outputs, total = [], 0.0
        for number, datum in enumerate(request.forward_backward_input.data):
            tokens = datum.model_input.to_ints()
            inputs = {key: datum.loss_fn_inputs[key].tolist() for key in ("target_tokens", "logprobs", "advantages") if key in datum.loss_fn_inputs}
            if len(inputs) != 3 or any(len(values) != len(tokens) for values in inputs.values()):
                raise RequestFailure(f"datum {number}: {loss_fn} needs target_tokens, logprobs and advantages, one per input token")
            new = [token_logprob(int(target), model.steps) for target in inputs["target_tokens"]]
            total += rl_loss(loss_fn, dict(config or {}), new, inputs["logprobs"], inputs["advantages"])
            outputs.append({"logprobs": types.TensorData(data=new, dtype="float32", shape=[len(new)])})
        return model.model_id, types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": total})

    def _optim_step(self, request: dict[str, Any]) -> tuple[str, types.OptimStepResponse]:
        step = types.OptimStepRequest.model_validate(request)
        model = self._model(step.model_id, step.seq_id)
        if not isinstance(step.optim_params, types.AdamParams):
            raise RequestFailure("the fake steps Adam only")
        model.steps += 1
        return model.model_id, types.OptimStepResponse(metrics={"learning_rate": step.optim_params.learning_rate})

    def _save(self, model: FakeModel, name: str | None, kind: Literal["state", "sampler"], ttl: int | None, overwrite: bool) -> str:
        if name is None:
            raise RequestFailure("the fake saves named checkpoints only")
        if ttl is not None and not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise RequestFailure(f"ttl_seconds {ttl} is outside {MIN_TTL_S}..{MAX_TTL_S}")
        path = f"tinker://{model.model_id}/{'weights' if kind == 'state' else 'sampler_weights'}/{name}"
        if path in self.saved and not overwrite:
            raise RequestFailure(f"a checkpoint {path} exists")
        self.saved[path] = SavedWeights(
            path=path, kind=kind, model_id=model.model_id, base_model=model.base_model, lora_rank=model.lora_rank, steps=model.steps, ttl_seconds=ttl
        )
        return path

    def _save_weights(self, request: dict[str, Any]) -> tuple[str, types.SaveWeightsResponse]:
        save = types.SaveWeightsRequest.model_validate(request)
        model = self._model(save.model_id, save.seq_id)
        path = self._save(model, save.path, "state", save.ttl_seconds, save.overwrite)
        return model.model_id, types.SaveWeightsResponse(path=path, type="save_weights")

    def _save_weights_for_sampler(self, request: dict[str, Any]) -> tuple[str, types.SaveWeightsForSamplerResponseInternal]:
        save = types.SaveWeightsForSamplerRequest.model_validate(request)
        model = self._model(save.model_id, save.seq_id)
        path = self._save(model, save.path, "sampler", save.ttl_seconds, overwrite=False)
        return model.model_id, types.SaveWeightsForSamplerResponseInternal(path=path, type="save_weights_for_sampler")

    # sampling

    def _create_sampling_session(self, request: dict[str, Any]) -> dict[str, Any]:
        create = types.CreateSamplingSessionRequest.model_validate(request)
        self._session(create.session_id)
        if create.model_path is None:
            raise Refusal(400, "the fake samples from saved sampler weights only (model_path)")
        saved = self.saved.get(create.model_path)
        if saved is None or saved.kind != "sampler":
            raise Refusal(404, f"no sampler weights at {create.model_path}")
        sampler_id = f"{create.session_id}:sample:{create.sampling_session_seq_id}"
        self.samplers[sampler_id] = FakeSampler(sampler_id=sampler_id, base_model=saved.base_model, model_path=create.model_path, steps=saved.steps)
        return self._dump(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id))

    def _sample(self, request: dict[str, Any]) -> dict[str, Any]:
        sample = types.SampleRequest.model_validate(request)
        sampler = self.samplers.get(sample.sampling_session_id or "")
        if sampler is None:
            raise Refusal(404, f"no sampling session {sample.sampling_session_id}")
        params = sample.sampling_params
        stop = list(params.stop) if isinstance(params.stop, Sequence) and not isinstance(params.stop, str) else []
        if not all(isinstance(token, int) for token in stop) or sample.num_samples != 1:
            raise Refusal(400, "the fake samples one sequence with stop token ids only")
        prompt = sample.prompt.to_ints()
        if self.context_window is not None and len(prompt) + (params.max_tokens or 0) > self.context_window:
            raise Refusal(400, f"prompt ({len(prompt)}) + max_tokens exceeds the context window ({self.context_window})")
        text = self._tokenizer.decode(prompt)
        turn = SampleTurn(prompt_text=text, turn=conversation_turn(text), seed=params.seed)
        self.sample_turns.append(turn)
        sequence_ids = [f"seq-{uuid.uuid4().hex[:12]}"]
        try:
            reply_text = self.script(turn)
        except ScriptRefusal as refusal:
            return self._failed_future(str(refusal), sequence_ids)
        reply = [int(t) for t in self._tokenizer.encode(reply_text, add_special_tokens=False)] + [int(t) for t in stop[:1]]
        stop_reason: Literal["stop", "length"] = "stop"
        if params.max_tokens is not None and len(reply) > params.max_tokens:
            reply, stop_reason = reply[: params.max_tokens], "length"
        cached = 0
        for earlier, now in zip(sampler.last, prompt):
            if earlier != now:
                break
            cached += 1
        sampler.last = prompt + reply
        logprobs = np.array([token_logprob(token, sampler.steps) for token in reply], dtype=np.float32)
        sequence = types.SampledSequence(stop_reason=stop_reason, sequence_id=sequence_ids[0], tokens_np=np.array(reply, dtype=np.int32), logprobs_np=logprobs)
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        response = types.SampleResponse(sequences=[sequence], prompt_cache_hit_tokens=cached)
        self.futures[request_id] = Outcome(polls_left=self.polls_before_result, proto_body=sample_response_proto(response))
        return self._dump(types.UntypedAPIFuture(request_id=request_id, sample_sequence_ids=sequence_ids))

    def _failed_future(self, message: str, sequence_ids: list[str]) -> dict[str, Any]:
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        failed = types.RequestFailedResponse(error=message, category=RequestErrorCategory.User)
        self.futures[request_id] = Outcome(polls_left=self.polls_before_result, json_body=self._dump(failed))
        return self._dump(types.UntypedAPIFuture(request_id=request_id, sample_sequence_ids=sequence_ids))


# ---------------------------------------------------------------------------------------------
# the losses and the wire formats


def rl_loss(loss_fn: str, config: dict[str, float | str], new: Sequence[float], behaviour: Sequence[float], advantages: Sequence[float]) -> float:
    """A built-in RL loss of one datum: importance_sampling -sum(r * A), cispo -sum(sg(clip(r)) * A * lp), r = exp(lp - sampling_lp)."""
    ratios = [math.exp(n - b) for n, b in zip(new, behaviour)]
    if loss_fn == "importance_sampling":
        return -sum(r * a for r, a in zip(ratios, advantages))
    clip = {**CISPO_DEFAULTS, **{key: float(value) for key, value in config.items()}}
    weights = [min(max(r, clip["clip_low_threshold"]), clip["clip_high_threshold"]) for r in ratios]
    return -sum(w * a * n for w, a, n in zip(weights, advantages, new))


def forward_backward_request_from_proto(body: bytes) -> types.ForwardBackwardRequest:
    """The SDK's ForwardBackwardRequest from its protobuf body; Refusal unless the SDK's own encoder gives the same message back.

    Inverse of tinker proto/request_conv.py ``forward_backward_request_to_proto`` for text chunks without provenance spans.
    """
    from tinker.proto.request_conv import forward_backward_request_to_proto

    message = public_pb.ForwardBackwardRequest()
    message.ParseFromString(body)
    if message.forward_only:
        raise Refusal(400, "the fake runs forward_backward, not forward")
    if message.loss_fn not in get_args(LossFnType):
        raise Refusal(400, f"unknown loss_fn {message.loss_fn!r}")
    data = []
    for datum in message.data:
        if datum.model_input_spans or datum.loss_fn_input_spans or any(chunk.WhichOneof("chunk") != "encoded_text" for chunk in datum.model_input):
            raise Refusal(400, "the fake takes text chunks without provenance spans only")
        tokens = [int(t) for chunk in datum.model_input for t in np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32)]
        inputs = {name: _tensor_data_from_proto(tensor) for name, tensor in datum.loss_fn_inputs.items()}
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs))
    config: dict[str, float | str] = {}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=message.loss_fn, loss_fn_config=config or None),
        model_id=message.model_id,
        seq_id=message.seq_id,
    )
    if forward_backward_request_to_proto(request) != message:
        raise Refusal(400, "the forward_backward body holds fields the fake does not read")
    return request


def forward_backward_output_proto(output: types.ForwardBackwardOutput) -> bytes:
    """A ForwardBackwardOutput as the protobuf tinker proto/response_conv.py ``deserialize_forward_backward_output`` reads:
    one ArrayRecord, each field a BatchedTensor of the datums' flat arrays with byte offsets."""
    message = public_pb.ForwardBackwardOutput(loss_fn_output_type=output.loss_fn_output_type)
    for key, value in output.metrics.items():
        message.metrics[key] = value
    record = message.loss_fn_outputs.add(type_tag=output.loss_fn_output_type, num_datums=len(output.loss_fn_outputs))
    names = output.loss_fn_outputs[0].keys() if output.loss_fn_outputs else ()
    for name in names:
        arrays = [np.asarray(datum[name].to_numpy(), dtype=np.float32).ravel() for datum in output.loss_fn_outputs]
        offsets = np.cumsum([0] + [array.nbytes for array in arrays]).astype(np.int64)
        record.fields[name].CopyFrom(
            public_pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=public_pb.DTYPE_FLOAT32)
        )
    return message.SerializeToString()


def sample_response_proto(response: types.SampleResponse) -> bytes:
    """A SampleResponse as the protobuf tinker proto/response_conv.py ``deserialize_sample_response`` reads."""
    reasons = {"stop": public_pb.STOP_REASON_STOP, "length": public_pb.STOP_REASON_LENGTH}
    message = public_pb.SampleResponse(prompt_cache_hit_tokens=response.prompt_cache_hit_tokens)
    for sequence in response.sequences:
        entry = message.sequences.add(stop_reason=reasons[sequence.stop_reason], tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes())
        if sequence.logprobs is not None:
            entry.logprobs = np.asarray(sequence.logprobs, dtype=np.float32).tobytes()
    return message.SerializeToString()
