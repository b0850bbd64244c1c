"""Namespace strings <-> the small ids the index stores, kept in `namespaces.json`.

The file is rewritten atomically (temp file, fsync, rename) before any index record uses a
new id, so an id in the index always has a name on disk.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from protocol.atomic_files import write_atomically

log = logging.getLogger(__name__)

_VERSION = 1
MAX_NAMESPACE_ID = 0xFFFF  # the index stores ids as u16; 0 is never used


class NamespaceTable:
    """Bidirectional map of namespace name <-> id (1..65535). `damaged` is set when the
    file is missing or unreadable: ids in the index then cannot be trusted."""

    def __init__(self, path: Path, ids: dict[str, int], damaged: bool = False) -> None:
        self.path = path
        self.damaged = damaged
        self._ids = dict(ids)
        self._names = {i: name for name, i in ids.items()}
        self.file_bytes = path.stat().st_size if path.exists() else 0

    @classmethod
    def load(cls, path: Path) -> NamespaceTable:
        if not path.exists():  # fine for a new store, damage if the index has entries
            return cls(path, {}, damaged=True)
        try:
            data = json.loads(path.read_bytes())
            ids = data["namespaces"]
            if data.get("version") != _VERSION or not isinstance(ids, dict):
                raise ValueError("unknown layout")
            if not all(isinstance(k, str) and isinstance(v, int) and 0 < v <= MAX_NAMESPACE_ID for k, v in ids.items()):
                raise ValueError("bad entry")
            if len(set(ids.values())) != len(ids):
                raise ValueError("duplicate id")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s); the index will be rebuilt", path, exc)
            return cls(path, {}, damaged=True)
        return cls(path, ids)

    @classmethod
    def fresh(cls, path: Path) -> NamespaceTable:
        """An empty table that replaces whatever is on disk."""
        table = cls(path, {})
        table._save()
        return table

    def find(self, name: str) -> int | None:
        return self._ids.get(name)

    def id_of(self, name: str) -> int:
        """The id of `name`, assigning (and persisting) a new one if needed."""
        found = self._ids.get(name)
        if found is not None:
            return found
        new_id = max(self._names, default=0) + 1
        if new_id > MAX_NAMESPACE_ID:
            raise ValueError(f"more than {MAX_NAMESPACE_ID} namespaces; clear the store")
        self._ids[name] = new_id
        self._names[new_id] = name
        self._save()
        return new_id

    def name_of(self, namespace_id: int) -> str | None:
        return self._names.get(namespace_id)

    def items(self) -> list[tuple[str, int]]:
        return sorted(self._ids.items(), key=lambda item: item[1])

    def _save(self) -> None:
        body = {"version": _VERSION, "namespaces": self._ids}
        data = json.dumps(body, sort_keys=True).encode("utf-8")
        write_atomically(self.path, data)
        self.file_bytes = len(data)
        self.damaged = False
