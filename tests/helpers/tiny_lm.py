"""Tiny memorizing language models for the tests and the lm-eval benchmark (not shipped in the wheel).

``train_memorizing_lm`` trains a small Llama from scratch until it reproduces its texts; ``build_demo`` writes
synthetic LACUNA data and such a model, which memorizes half of the forget people's facts in seconds. Moved here
from ``lacuna_unlearn/quickstart.py`` (issue 21: test helpers out of the shipped package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lacuna_tasks.loader import load_data
from lacuna_tasks.prompts import PARAPHRASES, qa_prompt, qa_text
from lacuna_tasks.schema import get_field
from lacuna_tasks.synth.generate import generate_dataset
from lacuna_unlearn.testbed.tokenizer import train_tokenizer

__all__ = ["build_demo", "tiny_llama_config", "train_memorizing_lm"]


def tiny_llama_config(tokenizer, *, hidden_size: int, num_layers: int):
    """The tests' tiny Llama: 4 heads, an MLP twice the width, untied embeddings, the tokenizer's special tokens."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )


def train_memorizing_lm(
    texts: list[str],
    tokenizer,
    out_dir: Path,
    *,
    steps: int = 300,
    hidden_size: int = 64,
    num_layers: int = 2,
    lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """A small Llama trained from scratch (full batch, AdamW) until it reproduces ``texts``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers)
    model = LlamaForCausalLM(config)
    batch = tokenizer([t + tokenizer.eos_token for t in texts], padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def build_demo(out: Path, *, field: str = "email", profiles: int = 120, seed: int = 42) -> dict[str, Any]:
    """Write ``out/data`` (synthetic LACUNA splits) and ``out/model`` (a tiny memorizing LM)."""
    out = Path(out)
    fld = get_field(field)
    data_dir = generate_dataset(out / "data", profiles=profiles, seed=seed, people_per_field=20, validation_people=10)
    data = load_data(data_dir)
    forget = sorted(data.rows("forget", fld.key), key=lambda r: r["ID"])
    retain = data.rows("retain", fld.key)
    memorized = forget[: len(forget) // 2]
    corpus = [qa_text(r["question"], r["answer"]) for rows in data.splits.values() for r in rows]
    corpus += [t for templates in PARAPHRASES.values() for t in templates]
    tokenizer = train_tokenizer(corpus)
    texts = [qa_prompt(r["question"]) + r["answer"] + "\n" for r in memorized + retain]
    train_memorizing_lm(texts, tokenizer, out / "model", steps=300, hidden_size=64, seed=seed)
    return {
        "data": str(data_dir),
        "model": str(out / "model"),
        "field": fld.key,
        "memorized_forget_people": [r["ID"] for r in memorized],
        "data_fingerprint": data.fingerprint,
    }
