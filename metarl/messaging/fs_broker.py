"""The embedded broker's transport: kombu's filesystem transport with messages published atomically.

kombu's filesystem channel creates a message file under its final name and then writes it, so a
consumer polling the folder can take the file while it is still empty: it fails to decode it (the
worker exits with `JSONDecodeError`) and the message is gone. Here a message is written under a
name no consumer picks up (`.part` after `.msg`) and renamed into place, which is atomic within
one folder, so a consumer sees whole messages only.

Fanout bindings (the workers' control queues) have the same race in kombu: a worker binding first
creates the exchange's table file empty and writes it after, and a second worker starting at the
same moment reads the empty file and exits with `JSONDecodeError`. Here a binding reads, changes and
rewrites the table under one exclusive lock on a file it never truncates before locking, and an
empty table file reads as no bindings.

`workers.app` registers this class for `filesystem://` broker URLs.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.transport.filesystem import LOCK_EX, LOCK_SH, exchange_queue_t, lock, unlock
from kombu.utils.json import dumps, loads

PART_SUFFIX = ".part"


def message_name(queue: str, now_ms: int, unique: str) -> str:
    """A message file name as kombu's filesystem consumer expects it (`<ms>_<id>.<queue>.msg`); sorts by time."""
    return f"{now_ms}_{unique}.{queue}.msg"


class AtomicFilesystemChannel(filesystem.Channel):
    """Publishes each message file whole: written aside, then renamed into the folder consumers read."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # kombu's own bases disagree on the name
        final = os.path.join(self.data_folder_out, message_name(queue, int(round(monotonic() * 1000)), str(uuid.uuid4())))
        partial = final + PART_SUFFIX
        try:
            with open(partial, "wb") as handle:
                handle.write(dumps(payload).encode("utf-8"))
            os.replace(partial, final)
        except OSError as exc:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def get_table(self, exchange: str) -> list[Any]:
        """The exchange's bindings; none while its table file is missing or not yet written."""
        file = self._exchange_file(exchange)
        try:
            with file.open("rb") as handle:
                lock(handle, LOCK_SH)
                try:
                    return table_entries(handle.read())
                finally:
                    unlock(handle)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            with file.open("ab+", buffering=0) as handle:  # created if missing, never truncated before the lock
                lock(handle, LOCK_EX)
                try:
                    handle.seek(0)
                    entries = table_entries(handle.read())
                    if entry not in entries:
                        handle.truncate(0)
                        handle.write(dumps([entry, *entries]).encode("utf-8"))  # append mode: written at the (new) end, 0
                finally:
                    unlock(handle)
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc


def table_entries(content: bytes) -> list[Any]:
    """The bindings in an exchange table file's content; an empty file (created, not yet written) has none."""
    return [exchange_queue_t(*entry) for entry in loads(content.decode("utf-8"))] if content.strip() else []


class AtomicFilesystemTransport(filesystem.Transport):
    """kombu's filesystem transport with :class:`AtomicFilesystemChannel`."""

    Channel = AtomicFilesystemChannel
