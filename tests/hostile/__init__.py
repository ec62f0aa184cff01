"""The hostile suite: phaseprobe run as an attacker and a careless user would (issues 18 and 33).

Every server and file a case uses is made by the test itself (:mod:`tests.hostile.cases`), with
bounded sizes and times, so the suite runs in the ordinary unit run (``pytest`` collects
``tests/``; CI's ``-m "integration or not integration"`` includes it) and needs no vLLM.

The classes of attack, and where they live:

- **unbounded reads**: gzip bombs and endless bodies from ``/metrics``, ``/v1/models``,
  Prometheus, Grafana; ``.gz`` inputs that expand past the cap (``test_network_bounds``,
  ``test_input_files``);
- **deadlines**: headers trickled, servers that accept and never answer, ``--timeout`` and
  ``--deadline`` from the connection on (``test_network_bounds``, ``test_every_command``);
- **secrets**: servers that echo the bearer token, URL passwords, launch-env values; the
  console, the store and every file written are grepped for them (``test_secret_echo``,
  ``test_secret_sweep``);
- **server-named paths**: a ``/v1/models`` ``root`` outside the allowed model directory
  (``test_input_files``);
- **numbers at the edge**: NaN, infinities, 1e308, int64, zero and negative options, damaged
  calibration files (``test_every_command``);
- **large inputs**: many processes, many devices, deep JSON (``test_every_command``,
  ``test_input_files``);
- **honest results**: zero-token streams, ``head_dim 0``, PromQL selectors parsed as label
  matchers and never spliced (``test_network_bounds``, ``test_selectors``; a real Prometheus
  reads the quoted model names in ``tests/integration/test_selector_quoting_real.py``);
- **unclear messages**: a directory, FIFO, symlink loop, ``/dev/zero``, ``-`` or a missing
  file given to every command that takes an input path is named as what it is
  (``test_input_paths``, ``test_input_files``);
- **children and signals**: benchmark children never outlive ``--timeout`` or SIGTERM
  (``test_children``);
- **store faults**: a store that is a directory, not SQLite, read-only or damaged
  (``test_every_command``).
"""
