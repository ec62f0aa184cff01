"""The one percentile/median helper: numpy's interpolation, missing values left out."""

import math

import numpy as np
import pytest

from phaseprobe.analysis.quantiles import median_or_none, percentile


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_is_numpys_linear_interpolation(q):
    xs = [0.3, 0.1, 0.7, 0.2, 1.5, 0.9, 0.4]
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_missing_values_are_left_out_and_nothing_is_none():
    assert percentile([1.0, None, 3.0, math.nan], 50) == 2.0
    assert median_or_none([None, 4.0, 1.0, 2.0]) == 2.0
    assert percentile([], 50) is None and median_or_none([None, math.nan]) is None
