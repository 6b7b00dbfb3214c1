"""``lacuna demo``: the main job on the embedded default, and tiny memorizing models for tests.

``run_demo`` builds (or reuses) the mini LACUNA testbed and evaluates its model with the bare
``lm_eval --tasks lacuna_<field>`` CLI on the testbed's own data. Unlearning, scoring and the
report join this run as ``lacuna run`` lands.

``build_demo`` / ``train_memorizing_lm`` make a tiny LM that memorizes half of the forget people's
facts in seconds, for tests and the lm-eval benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lacuna_tasks.generate import generate_dataset
from lacuna_tasks.loader import load_data
from lacuna_tasks.prompts import PARAPHRASES, qa_prompt, qa_text
from lacuna_tasks.schema import get_field
from lacuna_unlearn.tokenizer import train_tokenizer

DEMO_PACKAGES = ("lacuna-bench", "lm_eval", "torch", "transformers", "tokenizers", "datasets", "faker")


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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
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


def run_demo(
    out: str | Path = "runs/demo", *, preset: str = "mini", field: str = "email", seed: int | None = None
) -> Path:
    """Build or reuse ``out/testbed`` and evaluate its model with ``lm_eval --tasks lacuna_<field>``."""
    from lacuna_metrics.manifest import package_versions, write_json
    from lacuna_unlearn.testbed import build_testbed
    from lacuna_unlearn.testbed_presets import get_preset

    out = Path(out)
    testbed = out / "testbed"
    wanted = get_preset(preset) if seed is None else get_preset(preset, seed=seed)
    started = time.time()
    manifest_file = testbed / "manifest.json"
    reused = manifest_file.exists() and json.loads(manifest_file.read_text()).get("config") == wanted.to_dict()
    if reused:
        print(f"reusing the {preset} testbed in {testbed} (same settings)", flush=True)
    else:
        build_testbed(testbed, preset=preset, seed=seed, force=True)
    built = time.time()
    lm_eval = Path(sys.executable).with_name("lm_eval")
    cmd = [
        str(lm_eval) if lm_eval.exists() else "lm_eval",
        "--model", "hf",
        "--model_args", f"pretrained={testbed / 'model'},dtype=float32",
        "--tasks", f"lacuna_{get_field(field).key}",
        "--metadata", json.dumps({"lacuna_data": str(testbed / "data")}),
        "--batch_size", "32",
        "--output_path", str(out / "lm_eval"),
    ]  # fmt: skip
    print("$ " + " ".join(cmd[:4] + [repr(a) if " " in a else a for a in cmd[4:]]), flush=True)
    subprocess.run(cmd, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    manifest = {
        "testbed": str(testbed),
        "preset": preset,
        "field": field,
        "testbed_reused": reused,
        "command": cmd,
        "wall_seconds": {"testbed": round(built - started, 1), "evaluate": round(time.time() - built, 1)},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(DEMO_PACKAGES),
    }
    write_json(out / "demo_manifest.json", manifest)
    return out
