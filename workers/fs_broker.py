"""The embedded broker's transport: kombu's filesystem transport with messages published atomically.

kombu's filesystem channel creates a message file under its final name and then writes it, so a
consumer polling the folder can take the file while it is still empty: it fails to decode it (the
worker exits with `JSONDecodeError`) and the message is gone. Here a message is written under a
name no consumer picks up (`.part` after `.msg`) and renamed into place, which is atomic within
one folder, so a consumer sees whole messages only.

`workers.app` registers this class for `filesystem://` broker URLs.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

PART_SUFFIX = ".part"


def message_name(queue: str, now_ms: int, unique: str) -> str:
    """A message file name as kombu's filesystem consumer expects it (`<ms>_<id>.<queue>.msg`); sorts by time."""
    return f"{now_ms}_{unique}.{queue}.msg"


class AtomicFilesystemChannel(filesystem.Channel):
    """Publishes each message file whole: written aside, then renamed into the folder consumers read."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
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


class AtomicFilesystemTransport(filesystem.Transport):
    """kombu's filesystem transport with :class:`AtomicFilesystemChannel`."""

    Channel = AtomicFilesystemChannel
