"""A/B statistics: the comparison, sequential looks, noise, calibration, and when a P/D arm
is not alike."""
