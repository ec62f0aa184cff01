"""The A/B ledger in the store: each session's playbook as it was run, its settings and each
arm's experiment, so ``ab --resume`` replays a session as it was defined even if the playbook
file changed since.
"""

from __future__ import annotations

import json
import time
from typing import Any, TypedDict

from phaseprobe.errors import StoreError
from phaseprobe.store.db import Db, reads


class AbSessionRow(TypedDict):
    """One stored A/B session (:meth:`Store.ab_session`)."""

    id: int
    name: str
    created_wall_ns: int
    finished_wall_ns: int | None  # None: not finished (``ab --resume`` continues it)
    playbook_path: str
    playbook_text: str  # the playbook as run, secrets redacted
    settings: dict[str, Any]  # runs, sequential plan, stop record (the JSON it was saved as)
    arms: dict[str, int]  # arm name → experiment id


class AbStore(Db):
    """A/B sessions: created, given their arms' experiments before any run, finished."""

    def create_ab_session(
        self, name: str, playbook_path: str, playbook_text: str, settings: dict[str, Any]
    ) -> int:
        cur = self._write(
            "INSERT INTO ab_sessions (name, created_wall_ns, playbook_path, playbook_text,"
            " settings_json) VALUES (?, ?, ?, ?, ?)",
            (name, time.time_ns(), playbook_path, playbook_text, json.dumps(settings)),
        )
        return int(cur.lastrowid or 0)

    def set_ab_arms(self, session_id: int, arms: dict[str, int]) -> None:
        """Record arm name -> experiment id (committed before any run of the session)."""
        self._write(
            "UPDATE ab_sessions SET arms_json = ? WHERE id = ?", (json.dumps(arms), session_id)
        )

    def update_ab_settings(self, session_id: int, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a session's settings (a sequential session's stop record)."""
        settings = self.ab_session(session_id)["settings"]
        self._write(
            "UPDATE ab_sessions SET settings_json = ? WHERE id = ?",
            (json.dumps({**settings, **changes}), session_id),
        )

    def finish_ab_session(self, session_id: int) -> None:
        self._write(
            "UPDATE ab_sessions SET finished_wall_ns = ? WHERE id = ?", (time.time_ns(), session_id)
        )

    @reads
    def ab_session(self, session_id: int) -> AbSessionRow:
        """One A/B session: its playbook text, settings and ``arms`` (name -> experiment id)."""
        row = (
            self._db.execute("SELECT * FROM ab_sessions WHERE id = ?", (session_id,)).fetchone()
            if self._has("ab_sessions")
            else None
        )
        if row is None:
            raise StoreError(f"no A/B session {session_id} in {self.path}")
        return {
            "id": row["id"],
            "name": row["name"],
            "created_wall_ns": row["created_wall_ns"],
            "finished_wall_ns": row["finished_wall_ns"],
            "playbook_path": row["playbook_path"],
            "playbook_text": row["playbook_text"],
            "settings": json.loads(row["settings_json"]),
            "arms": json.loads(row["arms_json"]),
        }

    @reads
    def ab_sessions(self) -> list[AbSessionRow]:
        """Every A/B session, oldest first, as :meth:`ab_session` gives it."""
        if not self._has("ab_sessions"):
            return []
        ids = [row[0] for row in self._db.execute("SELECT id FROM ab_sessions ORDER BY id")]
        return [self.ab_session(i) for i in ids]
