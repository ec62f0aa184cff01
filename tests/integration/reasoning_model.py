"""Make a reasoning variant of the local tiny model: ``<think>`` and ``</think>`` as tokens.

Run with the local vLLM venv's Python (it needs torch, safetensors and tokenizers, which come
with vLLM; phaseprobe is not importable there)::

    VENV/bin/python reasoning_model.py SRC_MODEL_DIR DST_DIR

The random-weight model cannot learn to reason, so it is not asked to: the two markers are
added to the vocabulary (two more rows of the embedding and the LM head, random like the
rest), and the chat template opens the assistant's turn with ``<think>``. vLLM's
``thinking_token_budget`` request option (with ``--reasoning-parser deepseek_r1``) then forces
``</think>`` after that many reasoning tokens, so a stream has a known number of reasoning
tokens followed by answer tokens. Deterministic: the same source gives the same files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

MARKERS = ("<think>", "</think>")
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
    "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: <think>"
    "{% endif %}"
)


def main(src: Path, dst: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer

    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    # not special: the parser finds the markers in the detokenized text, which drops specials
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    tok.save(str(tmp / "tokenizer.json"))
    weights = load_file(str(tmp / "model.safetensors"))
    gen = torch.Generator().manual_seed(41)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = weights[name]
        extra = torch.randn(vocab - w.shape[0], w.shape[1], generator=gen) * 0.02
        weights[name] = torch.cat([w, extra.to(w.dtype)]).contiguous()
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["vocab_size"] = vocab
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "chat_template.jinja").write_text(TEMPLATE)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    print(json.dumps({m: tok.token_to_id(m) for m in MARKERS}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
