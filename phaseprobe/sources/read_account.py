"""What a reader did with everything a file holds: nothing dropped without a word.

    acc = ReadAccount("tables", found=192, read=190, attributed=190, missing=["rank 4: ..."])
    acc.to_dict()   # the ``completeness`` key of a reader's --json document
    acc.to_dict()["words"]   # "read 190 of 192 tables; ..." (None when complete)

Every reader of a file people bring (NCCL logs, nccl-tests tables, nsys exports and stats) gives
one of these with its result, so a file that was read in part says so in its text and --json
output, and the checklist can warn with the same numbers (rule ``read_complete``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from phaseprobe.notes import Notes

__all__ = ["ReadAccount", "ReadAccountDoc", "account_words", "MAX_NAMED"]

MAX_NAMED = 50  # missing writers named one by one (the count covers them all)


class ReadAccountDoc(TypedDict):
    """The ``completeness`` key of a reader's document."""

    unit: str  # what a record is for this reader: "NCCL records", "tables", "rows", ...
    found: int  # records the file holds, as far as the reader can see them
    read: int  # read whole
    attributed: int  # tied to their writer (process, rank, device)
    cut: int  # cut by another writer's output
    salvaged: int  # cut and never made whole, fields stated before the cut kept
    unattributed: int  # tied to no writer
    missing: list[str]  # writers or reports in the file but absent from the result, in words
    missing_count: int
    notes: list[str]  # how parts were read (names from column shapes, ...)
    complete: bool  # every record found was read and attributed, nothing missing
    words: str | None  # account_words of it: what an incomplete read lacks, in one sentence


@dataclass
class ReadAccount:
    """Counts of one reader's records, and the writers it could not bring into its result."""

    unit: str
    found: int = 0
    read: int = 0
    attributed: int = 0
    cut: int = 0
    salvaged: int = 0
    unattributed: int = 0
    missing: list[str] = field(default_factory=list)
    notes: Notes = field(default_factory=Notes)

    @property
    def complete(self) -> bool:
        """True when every record found was read, none is unattributed and no writer is missing."""
        return self.read >= self.found and not self.unattributed and not self.missing

    def to_dict(self) -> ReadAccountDoc:
        """The account as a JSON-ready dict: at most MAX_NAMED missing writers named, their full
        count, and the account in words."""
        doc: ReadAccountDoc = {
            "unit": self.unit,
            "found": self.found,
            "read": self.read,
            "attributed": self.attributed,
            "cut": self.cut,
            "salvaged": self.salvaged,
            "unattributed": self.unattributed,
            "missing": self.missing[:MAX_NAMED],
            "missing_count": len(self.missing),
            "notes": self.notes.to_list(),
            "complete": self.complete,
            "words": None,
        }
        doc["words"] = account_words(doc)
        return doc


def account_words(doc: Mapping[str, Any] | None) -> str | None:
    """One sentence for an incomplete read (None when the read was complete or not given):
    the numbers, then what is missing by name."""
    if not doc or doc.get("complete", True):
        return None
    unit = doc.get("unit", "records")
    parts = [f"read {doc.get('read', 0):,} of {doc.get('found', 0):,} {unit}"]
    if doc.get("cut"):
        parts.append(
            f"{doc['cut']:,} cut by other output ({doc.get('salvaged', 0):,} salvaged in part)"
        )
    if doc.get("unattributed"):
        parts.append(f"{doc['unattributed']:,} tied to no writer")
    missing = list(doc.get("missing") or [])
    if missing:
        more = int(doc.get("missing_count", len(missing))) - len(missing)
        parts.append(
            "not in the result: " + "; ".join(missing) + (f"; and {more} more" if more > 0 else "")
        )
    return "; ".join(parts)
