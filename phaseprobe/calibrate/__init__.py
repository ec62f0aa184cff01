"""``phaseprobe calibrate``: measure this machine's memory bandwidth and matmul FLOP/s.

The measurement itself is :mod:`phaseprobe.calibrate.bench_script`, a standalone torch script
run in a subprocess (phaseprobe never imports torch); :mod:`phaseprobe.calibrate.run` picks the
interpreter, parses the result and stores it.
"""

from phaseprobe.calibrate.run import (
    Calibration,
    CalibrationError,
    calibration_path,
    find_interpreter,
    load,
    load_all,
    run_benchmark,
    save,
)

__all__ = [
    "Calibration",
    "CalibrationError",
    "calibration_path",
    "find_interpreter",
    "load",
    "load_all",
    "run_benchmark",
    "save",
]
