"""The Grafana dashboards: ``build`` generates them from the query catalog, ``lint`` checks
their metrics against a real vLLM ``/metrics``, ``api`` imports them over Grafana's HTTP API."""
