"""The command line: ``entry`` parses and dispatches, one ``cmd_<name>`` module per command
(it parses its flags and renders; the wiring is in ``collect``), and the console helpers they
share (``args``, ``console``, ``safe_console``, ``waiting``, ``keep``)."""

from phaseprobe.present.cli.entry import build_parser, main

__all__ = ["main", "build_parser"]
