"""The embedded broker's transport publishes whole messages: consumers never see a half-written file."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES

import metarl.messaging.fs_broker
import workers.app  # noqa: F401  (registers the transport for filesystem:// URLs)
from metarl.messaging.fs_broker import PART_SUFFIX, AtomicFilesystemTransport, message_name

MESSAGES = 300


def fresh_queue() -> str:
    """A queue name of its own: kombu keeps bindings per process, per queue name."""
    return f"train{uuid.uuid4().hex[:8]}"


def connection(folder: Path) -> Connection:
    (folder / "control").mkdir(exist_ok=True)
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder / "control"), "polling_interval": 0.01}
    return Connection("filesystem://", transport_options=options)


def test_filesystem_urls_use_the_atomic_transport(tmp_path: Path) -> None:
    assert TRANSPORT_ALIASES["filesystem"] == "metarl.messaging.fs_broker:AtomicFilesystemTransport"
    with connection(tmp_path) as conn:
        assert isinstance(conn.transport, AtomicFilesystemTransport)


def test_no_message_file_is_visible_before_its_content_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's own channel creates the (empty) message file first and serialises the payload after:
    a consumer listing the folder in between takes an empty message."""
    visible_while_serialising: list[list[str]] = []
    real_dumps = metarl.messaging.fs_broker.dumps

    def watching_dumps(payload: object) -> str:
        visible_while_serialising.append(sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".msg")))
        return real_dumps(payload)

    monkeypatch.setattr(metarl.messaging.fs_broker, "dumps", watching_dumps)
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(fresh_queue())
        queue.put({"episode": 1})
        message = queue.get(timeout=2)
        assert message.payload == {"episode": 1}
        message.ack()
        queue.close()
    assert visible_while_serialising and all(names == [] for names in visible_while_serialising), visible_while_serialising


def test_a_message_being_written_is_not_consumed(tmp_path: Path) -> None:
    # what a consumer finds mid-publish: the message under its temporary name, still empty
    name = fresh_queue()
    (tmp_path / (message_name(name, 1, "00000000-0000-4000-8000-000000000000") + PART_SUFFIX)).write_bytes(b"")
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name)
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)
        queue.put({"episode": 1})
        message = queue.get(timeout=2)
        assert message.payload == {"episode": 1}
        message.ack()
        queue.close()
    assert [path.suffix for path in tmp_path.iterdir() if path.is_file()] == [PART_SUFFIX]  # only the planted one is left


def test_concurrent_publishing_and_consuming_delivers_every_message_whole(tmp_path: Path) -> None:
    received: list[dict] = []
    errors: list[BaseException] = []
    name = fresh_queue()
    with connection(tmp_path) as conn:
        conn.SimpleQueue(name).close()  # declared and bound before either side starts

    def consume() -> None:
        try:
            with connection(tmp_path) as conn:
                queue = conn.SimpleQueue(name)
                while len(received) < MESSAGES:
                    message = queue.get(timeout=20)
                    received.append(message.payload)
                    message.ack()
                queue.close()
        except BaseException as err:  # noqa: BLE001 - reported to the main thread below, re-raised there
            errors.append(err)

    consumer = threading.Thread(target=consume)
    consumer.start()
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name)
        for index in range(MESSAGES):
            queue.put({"episode": index, "padding": "x" * 2000})
        queue.close()
    consumer.join(timeout=60)
    assert not consumer.is_alive() and not errors, errors
    assert sorted(item["episode"] for item in received) == list(range(MESSAGES))
    assert not any(path.name.endswith(PART_SUFFIX) for path in tmp_path.iterdir())


def bind_fanout(folder: str, queue_name: str) -> None:
    """Bind one queue to the shared fanout exchange, as a starting worker binds its control queue."""
    with connection(Path(folder)) as conn:
        Queue(queue_name, Exchange("control.fanout", type="fanout"))(conn.default_channel).declare()


def test_a_fanout_table_file_not_yet_written_reads_as_no_bindings(tmp_path: Path) -> None:
    """kombu's first binder creates the table file empty and writes it after; a binder or publisher reading it meanwhile must not fail."""
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "control.fanout.exchange").write_bytes(b"")
    with connection(tmp_path) as conn:
        assert conn.default_channel.get_table("control.fanout") == []
    bind_fanout(str(tmp_path), "worker-a")
    with connection(tmp_path) as conn:
        assert [entry.queue for entry in conn.default_channel.get_table("control.fanout")] == ["worker-a"]


def test_workers_binding_the_same_fanout_at_once_all_end_up_bound(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    names = [f"worker-{index}" for index in range(8)]
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=bind_fanout, args=(str(tmp_path), name)) for name in names]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=30)
    assert [process.exitcode for process in processes] == [0] * len(names)
    with connection(tmp_path) as conn:
        assert sorted(entry.queue for entry in conn.default_channel.get_table("control.fanout")) == names
