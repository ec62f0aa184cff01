"""Prometheus rules for vLLM, built from phaseprobe's phase model of a request (issue 40).

Pure: options in, rule groups out (:func:`build_rules`); :func:`rules_yaml` and
:func:`operator_yaml` write them as a Prometheus rule file or a Prometheus Operator
``PrometheusRule``. The SLO thresholds are mapped onto the histograms' buckets by
:mod:`~phaseprobe.analysis.alerts.buckets`.
"""

from phaseprobe.analysis.alerts.buckets import (
    VLLM_032_BUCKETS,
    BucketChoice,
    bounds_from_samples,
    choose_bucket,
)
from phaseprobe.analysis.alerts.render import operator_yaml, rules_yaml
from phaseprobe.analysis.alerts.rules import (
    ALERT_NAMES,
    AlertOptions,
    Rule,
    RuleGroup,
    RuleSet,
    build_rules,
)
from phaseprobe.analysis.alerts.selector_check import names_from_samples, selector_problems
from phaseprobe.analysis.alerts.slo import SloTargets, parse_slo

__all__ = [
    "ALERT_NAMES",
    "VLLM_032_BUCKETS",
    "bounds_from_samples",
    "AlertOptions",
    "BucketChoice",
    "Rule",
    "RuleGroup",
    "RuleSet",
    "SloTargets",
    "build_rules",
    "names_from_samples",
    "choose_bucket",
    "operator_yaml",
    "parse_slo",
    "rules_yaml",
    "selector_problems",
]
