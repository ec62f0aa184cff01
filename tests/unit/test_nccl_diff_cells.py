"""`nccl diff` cells read as words and units, never as Python or JSON literals (issue 16)."""

from __future__ import annotations

import re

from phaseprobe.present.cli.cmd_nccl import cell


def test_cells_from_the_diff_document_have_no_literals():
    assert cell({"coll": {"min": 2, "max": 2}, "p2p": {"min": 1, "max": 4}}) == "coll 2, p2p 1–4"
    assert cell({"P2P/IPC": 112, "NET/IB": 40}) == "P2P/IPC 112, NET/IB 40"
    assert cell({"net": 0.2632, "p2p": 0.7368}, share=True) == "net 26%, p2p 74%"
    assert cell({"8388608-16777216": 0.5}, share=True) == "8MiB–16MiB 50%"
    assert cell(["IB"]) == "IB" and cell({}) == "—" and cell(0) == "0"
    nested = {"AllReduce": {"RING/SIMPLE": 495}}
    for text in (cell(nested), cell({"coll": {"min": 2, "max": 2}})):
        assert not re.search(r"[{}\[\]'\"]", text), text
