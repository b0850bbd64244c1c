"""Named snapshots: sets of block keys pinned against eviction, kept in `pins.json` beside
the index so that they outlive the process.

The file is rewritten atomically (temp file, fsync, rename) on every change, before the
change is answered: after a crash it holds the pins as of the last answered pin or unpin.
Pins are by (namespace, key), not by index slot, so a key pinned before its block arrives
is pinned when it does, and a block moved by compaction stays pinned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.atomic_files import write_atomically
from protocol.block_keys import KEY_BYTES

log = logging.getLogger(__name__)

PINS_FILE = "pins.json"
_VERSION = 1


@dataclass
class Snapshot:
    name: str
    namespace: str
    keys: list[bytes]
    info: dict[str, Any] = field(default_factory=dict)  # what the router keeps with it (model, tokens, ...)
    created: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "keys": [k.hex() for k in self.keys], "info": self.info,
                "created": self.created}


class PinSet:
    """name -> Snapshot, and how many snapshots pin each (namespace, key).

    `file_bytes` is the size of the file on disk (counted in the store's disk use).
    An unreadable file is logged and set aside as `pins.json.bad`, never silently lost.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._snapshots: dict[str, Snapshot] = {}
        self._counts: Counter[tuple[str, bytes]] = Counter()
        self.file_bytes = 0
        if path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_bytes())
            if data.get("version") != _VERSION or not isinstance(data.get("snapshots"), dict):
                raise ValueError("unknown layout")
            for name, entry in data["snapshots"].items():
                keys = [bytes.fromhex(k) for k in entry["keys"]]
                if not isinstance(entry["namespace"], str) or any(len(k) != KEY_BYTES for k in keys):
                    raise ValueError(f"bad snapshot {name!r}")
                self._add(Snapshot(name, entry["namespace"], keys, dict(entry.get("info") or {}),
                                   float(entry.get("created") or 0.0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            bad = self.path.with_name(self.path.name + ".bad")
            log.error("%s is unreadable (%s): no snapshot is pinned; the file is kept as %s",
                      self.path, exc, bad.name)
            self._snapshots.clear()
            self._counts.clear()
            with contextlib.suppress(OSError):
                self.path.replace(bad)
            return
        self.file_bytes = self.path.stat().st_size
        if self._snapshots:
            log.info("%d snapshot(s) pinned: %s", len(self._snapshots), ", ".join(sorted(self._snapshots)))

    def _add(self, snapshot: Snapshot) -> None:
        self._snapshots[snapshot.name] = snapshot
        self._counts.update((snapshot.namespace, key) for key in set(snapshot.keys))

    def __contains__(self, name: object) -> bool:
        return name in self._snapshots

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(sorted(self._snapshots.values(), key=lambda s: s.name))

    def is_pinned(self, namespace: str, key: bytes) -> bool:
        return self._counts[(namespace, key)] > 0

    def add(self, name: str, namespace: str, keys: Sequence[bytes], info: dict[str, Any]) -> Snapshot:
        """Pin a new snapshot and save the file; the name must be free."""
        assert name not in self._snapshots
        snapshot = Snapshot(name, namespace, [bytes(k) for k in keys], dict(info), time.time())
        self._add(snapshot)
        try:
            self._save()
        except BaseException:
            self._remove(name)
            raise
        return snapshot

    def remove(self, name: str) -> tuple[Snapshot, list[bytes]] | None:
        """Unpin a snapshot and save the file: (it, its keys no other snapshot pins), or
        None if there is none of that name."""
        if name not in self._snapshots:
            return None
        snapshot, freed = self._remove(name)
        try:
            self._save()
        except BaseException:
            self._add(snapshot)
            raise
        return snapshot, freed

    def _remove(self, name: str) -> tuple[Snapshot, list[bytes]]:
        snapshot = self._snapshots.pop(name)
        freed = []
        for key in set(snapshot.keys):
            self._counts[(snapshot.namespace, key)] -= 1
            if self._counts[(snapshot.namespace, key)] <= 0:
                del self._counts[(snapshot.namespace, key)]
                freed.append(key)
        return snapshot, freed

    def _save(self) -> None:
        body = {"version": _VERSION, "snapshots": {s.name: s.as_json() for s in self}}
        data = json.dumps(body, sort_keys=True).encode("utf-8")
        write_atomically(self.path, data)
        self.file_bytes = len(data)
