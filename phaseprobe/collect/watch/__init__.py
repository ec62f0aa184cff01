"""``phaseprobe watch``, wired: what the command's flags ask for, opened once, handing the view a
snapshot every refresh.

- :mod:`.options`: :class:`~.options.WatchOptions`, the flags as plain values, checked (typed
  errors before anything starts) and their secrets registered for the mask;
- :mod:`.session`: :func:`~.session.open_watch`, the one entry (receiving or reading);
- :mod:`.pace`: when a watch refreshes and ends, for either mode;
- :mod:`.receive`: the span receiver, the store's retention, the finished-request counters,
  ``--demo``'s local vLLM and its load; a :class:`~.receive.WatchTick` per refresh;
- :mod:`.read`: ``--spans-from``, a fleet's span store polled (no receiver);
- :mod:`.fleet`: the per-replica part, carried between refreshes (verdicts are costly);
- :mod:`.counters`: each server's finished-request counter against the spans it sent.

Nothing here draws: ``present/cli/cmd_watch.py`` renders the snapshots.
"""
