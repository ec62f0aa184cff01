"""Build a tiny random Llama-style model locally (no downloads), for the embedded local vLLM.

STANDALONE SCRIPT: run it with the vLLM venv's interpreter,

    VENV/bin/python tiny_model.py --out DIR

It imports only the standard library plus ``tokenizers``/``transformers``/``torch`` (which exist
in that venv only); phaseprobe itself must never import them, so nothing here imports
phaseprobe either.

The model: a byte-level BPE tokenizer trained on ~200 of Python's own stdlib files (sorted, so
the result is the same on every run of the same Python), vocab 2048, with a chat template
(without one vLLM answers 400 to /v1/chat/completions), and a 2-layer Llama with grouped-query
attention, random weights from a fixed seed, saved in bfloat16 as safetensors. Its output is
gibberish; the point is that vLLM's timings and metrics around it are real.

The model is built in ``DIR.tmp`` and renamed to ``DIR`` only when complete, with a marker file
inside, so a crash or Ctrl-C never leaves a half-written model where vLLM would load it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

MARKER_NAME = ".phaseprobe-model.json"
MODEL_VERSION = "tiny-llama-v1"
VOCAB_SIZE = 2048
N_TRAINING_FILES = 200
SEED = 1234
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]

# Plain role-prefixed turns. BOS is written by the template because vLLM tokenizes rendered
# chat prompts without adding special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def training_files(limit: int = N_TRAINING_FILES) -> list[Path]:
    """The first stdlib sources by relative path: deterministic for a given Python version.
    Installed packages and test suites are skipped: they differ between machines."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    candidates = (p for p in stdlib.rglob("*.py") if p.is_file())
    kept = (p for p in candidates if not skip & set(p.relative_to(stdlib).parts))
    files = sorted(kept, key=lambda p: p.relative_to(stdlib).as_posix())
    if len(files) < 20:
        raise SystemExit(f"tiny_model: too few training files found in {stdlib}")
    return files[:limit]


def build_tokenizer(files: list[Path]) -> Any:  # a transformers.PreTrainedTokenizerFast
    # Only the vLLM venv has these; mypy runs where phaseprobe is installed.
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found,unused-ignore]

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (path.read_text(encoding="utf-8", errors="replace") for path in files)
    tok.train_from_iterator(texts, trainer=trainer, length=len(files))
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer: Any) -> Any:  # a transformers.LlamaForCausalLM
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found,unused-ignore]

    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def build(out: Path) -> dict[str, object]:
    """Create the model at ``out`` unless a complete one is already there; return its summary."""
    marker = out / MARKER_NAME
    if marker.is_file():
        return {"out": str(out), "created": False, **json.loads(marker.read_text())}
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        # Refuse to replace a folder that was never a model: --out may simply be mistyped.
        raise SystemExit(f"tiny_model: {out} exists and is not a model directory")
    started = time.monotonic()
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # leftover of an interrupted run
    tmp.mkdir(parents=True)

    files = training_files()
    tokenizer = build_tokenizer(files)
    model = build_model(tokenizer)
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    model.generation_config.save_pretrained(tmp)

    summary: dict[str, object] = {
        "version": MODEL_VERSION,
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "training_files": len(files),
        "python": sys.version.split()[0],
        "seconds": round(time.monotonic() - started, 3),
        "created_at": time.time(),
    }
    (tmp / MARKER_NAME).write_text(json.dumps(summary, indent=2))
    if out.exists():
        shutil.rmtree(out)  # an earlier model without marker: incomplete by definition
    os.replace(tmp, out)
    return {"out": str(out), "created": True, **summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", required=True, type=Path, help="model directory to create")
    args = parser.parse_args(argv)
    summary = build(args.out.resolve())
    # One JSON line on stdout: what phaseprobe reads back (library noise goes to stderr).
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
