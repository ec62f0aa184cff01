"""The Grafana dashboards: ``build`` generates them from the query catalog, ``lint`` checks
their metrics against a real vLLM ``/metrics``; :mod:`phaseprobe.collect.grafana_api` imports
them over Grafana's HTTP API."""
