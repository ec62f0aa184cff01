"""The one format module: a value that is not zero never reads as zero, one missing marker."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phaseprobe import format as fmt


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0000123, "12.3 µs"),
        (2.5e-9, "2.50 ns"),
        (0.1609, "161 ms"),
        (0.0009999, "1.00 ms"),
        (12.5, "12.5 s"),
        (0, "0 s"),
        (-0.002, "-2.00 ms"),
        (None, "—"),
        (math.nan, "—"),
    ],
)
def test_duration(seconds, text):
    assert fmt.duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "digits", "text"),
    [
        (0.0123, 1, "12.3"),
        (0.000005, 1, "0.005"),
        (0.000005, 3, "0.005"),
        (0, 1, "0"),
        (12.3456, 2, "12,345.60"),
        (None, 1, "—"),
    ],
)
def test_ms_cell(seconds, digits, text):
    assert fmt.ms_cell(seconds, digits) == text


def test_ns_cell_and_units():
    assert fmt.ns_cell(24_400_000) == "24.400"
    assert fmt.ns_cell(None) == "—"
    assert fmt.ms(0.0123) == "12.3 ms" and fmt.ms(None) == "—"
    assert fmt.percent(12.345) == "12.3 %"
    assert fmt.efficiency(0.00028) == "0.028 %" and fmt.efficiency(0.5) == "50.0 %"
    assert fmt.bandwidth(150e9) == "150.0 GB/s" and fmt.bandwidth(2.5e9) == "2.5 GB/s"


@given(st.floats(min_value=1e-12, max_value=1e6))
def test_nonzero_never_reads_as_zero(seconds):
    for text in (fmt.duration(seconds), fmt.ms_cell(seconds), fmt.ms_cell(seconds, 3)):
        number = float(text.split()[0].replace(",", ""))
        assert number != 0, text
