"""The store's front: :class:`Store`, the one class callers open, made of the store's areas.

Each area is a subclass of :class:`~phaseprobe.store.db.Db` in its own module, and ``Store``
inherits them all rather than holding one object per area. So every area reads and writes
through the same ``_db``, ``_transaction``, ``_write`` and :func:`~phaseprobe.store.db.reads`
(whose re-read replaces the connection of a read-only store: an area object holding the old
connection would read a closed one), mypy types ``self`` in each area as the ``Db`` it is, and
the front keeps every method and signature the single class had with no forwarding method to
keep in step. Areas do not call each other, except that an analysis attached to an experiment
checks the experiment exists (``AnalysisStore`` extends ``ExperimentStore``).
"""

from __future__ import annotations

from phaseprobe.store.ab import AbStore
from phaseprobe.store.analyses import AnalysisStore
from phaseprobe.store.experiments import ExperimentStore
from phaseprobe.store.gpu import GpuStore
from phaseprobe.store.spans import SpanStore


class Store(AnalysisStore, ExperimentStore, SpanStore, AbStore, GpuStore):
    """The experiment store: ``Store(path, readonly=False, threaded=False, timeout=None)``
    opens it as :class:`~phaseprobe.store.db.Db` says, with every area's methods over that
    one connection: experiments and their runs (``ExperimentStore``), request spans and
    their retention (``SpanStore``), the A/B ledger (``AbStore``), kept analyses
    (``AnalysisStore``) and GPU samples (``GpuStore``)."""
