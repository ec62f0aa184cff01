"""``phaseprobe runs``: the stored experiments, or one experiment's runs and medians.

    phaseprobe runs              # every experiment, with its kind
    phaseprobe runs 12 [--json]  # the runs of experiment 12 and their medians
    phaseprobe runs --stall [ID] # stalled-engine evidence kept by watch / check --live

The medians are those of isolated requests (or requests whose isolation could not be checked).
``batch`` and ``interfere`` experiments also hold runs that shared the server *on purpose*
(batch streams, the A/B pairs of interfere): they are stored ``ok`` with isolation unverified,
so without care they would pass for unchecked single requests. They are shown, marked
"concurrent", and left out of the medians; the probe's own command reports them. Runs whose
client timeline contradicts the server's phases (a stalled client, a buffered stream:
:mod:`phaseprobe.analysis.client_check`) are left out too, each with its reason.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import positive_int, store_and_json_args
from phaseprobe.present.cli.console import (
    print_schema_note,
    render_efficiency,
    render_experiments,
    render_probe,
)

__all__ = ["register", "run", "CONCURRENT_NOTE"]

CONCURRENT_NOTE = (
    "batch and interfere experiments hold runs that are concurrent by design "
    "(batch streams, interfere A/B pairs): never isolated, so `phaseprobe runs "
    "ID` leaves them out of the medians; `phaseprobe batch|interfere` report "
    "them"
)
# What the concurrent runs of each kind are, for the "left out" line.
_ROLES = {
    "batch": "batch streams",
    "interfere": "A/B pairs; the A-alone baseline runs are isolated",
}


def register(subparsers: Any) -> None:
    runs = subparsers.add_parser("runs", help="list stored experiments, or the runs of one")
    runs.add_argument(
        "experiment", nargs="?", type=positive_int, help="experiment id (omit to list experiments)"
    )
    runs.add_argument(
        "--latest", action="store_true", help="show the runs of the latest experiment"
    )
    runs.add_argument(
        "--stall",
        nargs="?",
        type=positive_int,
        const=0,
        default=None,
        metavar="ID",
        help="the stalled-engine evidence kept by watch and check --live: the list, or "
        "one whole (its /metrics, log tail and py-spy stacks)",
    )
    store_and_json_args(runs)


def _stalls(store: Any, args: argparse.Namespace, out: Console) -> int:
    from phaseprobe.present.cli.render_stall import STALL_KIND, render_stall, render_stall_list

    if args.stall:
        doc = store.analysis(args.stall)
        if args.json:
            out.out(jsonout.dumps({"id": args.stall, **doc}), highlight=False)
        else:
            render_stall(out, args.stall, doc)
        return 0
    rows = store.analyses(STALL_KIND)
    if args.json:
        out.out(jsonout.dumps({"stalls": rows}), highlight=False)
    else:
        render_stall_list(out, rows)
    return 0


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.client_check import client_verdict, has_hop
    from phaseprobe.analysis.interplay import CONCURRENT_KINDS, concurrent_by_design
    from phaseprobe.analysis.phases import medians_runs, summarize
    from phaseprobe.collect.stall_evidence import STALL_KIND
    from phaseprobe.store import Store

    path = args.store or default_store_path()
    # Only reads: never creates, migrates or writes the store (a read-only one will do).
    with Store(path, readonly=True) as store:
        if args.stall is not None:
            return _stalls(store, args, out)
        exp_id = args.experiment
        if exp_id is None and args.latest:
            exp_id = store.latest_experiment_id()
        if exp_id is None:
            rows = store.experiments()
            size = store.storage_size()  # the store grows with spans: say how large it is
            print_schema_note(store, err)
            for row in rows:
                row["concurrent_by_design"] = row["kind"] in CONCURRENT_KINDS
            if args.json:
                out.out(
                    jsonout.dumps(
                        {
                            "store": str(path),
                            "experiments": rows,
                            "size": size,
                            "note": CONCURRENT_NOTE,
                        }
                    ),
                    highlight=False,
                )
            else:
                from phaseprobe.collect.spans.retention import size_text

                render_experiments(out, rows)
                out.print(
                    f"{escape(str(path))}: {size_text(size)} (`phaseprobe spans prune` "
                    "or `watch --retain` keeps it bounded)",
                    highlight=False,
                )
                if any(row["concurrent_by_design"] for row in rows):
                    out.print(f"[yellow]*[/] {CONCURRENT_NOTE}")
                stalls = store.analyses(STALL_KIND)
                if stalls:
                    out.print(
                        f"[red]{len(stalls)} stalled-engine evidence bundle(s)[/], the latest "
                        f"#{stalls[-1]['id']}: phaseprobe runs --stall {stalls[-1]['id']}"
                    )
            return 0
        exp = store.experiment(exp_id)
        runs = store.runs(exp_id)
        # The roofline report the probe printed (kept with the experiment since issue 16).
        kept = [a["id"] for a in store.analyses("efficiency") if a["experiment_id"] == exp_id]
        efficiency = store.analysis(kept[-1]) if kept else None
        print_schema_note(store, err)
    concurrent = [r for r in runs if concurrent_by_design(r)]
    single = [r for r in runs if not concurrent_by_design(r)]
    summary = summarize(single)
    hop = has_hop(exp.spec.endpoint)
    inconsistent = {
        r.seq: "; ".join(client_verdict(r, hop).reasons) for r in medians_runs(single)[1]
    }
    why = None
    if concurrent:
        roles = _ROLES.get(exp.kind, "concurrent by design")
        why = (
            f"{len(concurrent)} of {len(runs)} runs of this {exp.kind} experiment shared the "
            f"server on purpose ({roles}): they are left out of the medians, "
            f"which cover the other {summary.n_clean} run(s)"
        )
    if args.json:
        doc = {
            "experiment_id": exp_id,
            "name": exp.name,
            "kind": exp.kind,
            "spec": exp.spec.to_dict(),
            "server": exp.server_info,
            "notes": list(exp.notes),
            "summary": summary.to_dict(),
            "excluded_from_summary": {
                "concurrent_by_design": len(concurrent),
                "seqs": [r.seq for r in concurrent],
                "why": why,
                "client_inconsistent": len(inconsistent),
                "client_inconsistent_reasons": {
                    str(seq): why_ for seq, why_ in inconsistent.items()
                },
            },
            "efficiency": efficiency,
            "runs": [r.to_dict() for r in runs],
        }
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        # a stored name is the user's (--name) or a store's: text, never markup
        out.print(f"experiment {exp_id}: {escape(exp.name)} (kind {escape(exp.kind)})")
        render_probe(out, runs, summary, exp.server_info, exp.notes, exp_id)
        if efficiency is not None:
            render_efficiency(out, efficiency)
        if why:
            out.print(f"[yellow]left out:[/] {escape(why)}")
        for seq, reason in inconsistent.items():
            # The probe's notes already say it for runs judged when they were measured.
            if not any(n.startswith(f"run {seq + 1} left out of the medians") for n in exp.notes):
                out.print(
                    f"[yellow]left out:[/] run {seq + 1}: its client timeline contradicts "
                    f"the server's phases: {escape(reason)}"
                )
    return 0
