"""A tiny LACUNA release in the authors' published layout, for the tests (issue 36).

The layout is what ``scripts/download_artifacts.py`` of McGill-NLP/LACUNA (commit 93800b0) leaves on disk, with the
names of ``configs/paths/eval.yaml`` (docs/tasks.md, "LACUNA's released data"; /work/shared/spec/papers.md §1)::

    <root>/OLMo2-1B/masked/                      W_cpt: save_pretrained + tokenizer
    <root>/OLMo2-1B/masked/mask.pt               dict parameter name -> flat int32 tensor, bit g = group g
    <root>/OLMo2-1B/masked/intruction_tuned/     (sic) the model to unlearn
    <root>/OLMo2-1B/unmasked/                    the control run's W_cpt (no mask.pt)
    <root>/OLMo2-1B/unmasked/intruction_tuned/
    <root>/OLMo2-1B/data-<regime>/README.md      dataset card: configs -> data_files [{split, path}]
    <root>/OLMo2-1B/data-<regime>/data/<Config>_<split>.parquet

:func:`release_tables` turns lacuna-bench splits into the release's tables, :func:`write_release_data` writes one
``data-<regime>`` directory (typed as ``src/create_memorized_datasets.py`` types it) and :func:`write_release` the
whole tree from a data directory and a model: the session's tiny memorizing model (the ``tiny_release`` fixture) or,
without one, a tiny random Llama, so a unit test gets the full layout in a few seconds.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lacuna_tasks.loader import load_data, read_rows
from lacuna_tasks.prompts import lacuna_question
from lacuna_tasks.release_data import CARD_NAME, DATA_SUBDIR, FIELD_CONFIGS, RELEASE_SPLITS, VALIDATION_PREFIX
from lacuna_tasks.schema import FIELDS, FORGET_GROUPS

SIZE = "OLMo2-1B"
REGIMES: tuple[str, ...] = ("masked", "unmasked")
TUNED_DIR = "intruction_tuned"  # sic: the release's folder name
MASK_FILE = "mask.pt"
#: The tiny model's counterpart of LACUNA's "last two of 16 blocks": blocks left out of the masks, where the
#: instruction-tuning LoRA goes.
SKIP_LAST = 1
MAIN_SPLITS: tuple[str, ...] = ("forget", "retain", "forget_paraphrased", "retain_paraphrased")
CONFIG_OF: dict[str, str] = {column: config for config, column in FIELD_CONFIGS.items()}


@dataclass
class TinyRelease:
    root: Path  # <root>
    size_dir: Path  # <root>/OLMo2-1B
    tables: dict[str, list[dict[str, Any]]]  # "<Config>_<split>" -> rows, as written to each data-<regime>/data
    absent: dict[str, list[str]]  # field column -> IDs in another field's forget split but in none of this field's

    def model(self, regime: str = "masked") -> Path:
        """W_cpt of ``regime``: ``<size>/<regime>/``."""
        return self.size_dir / regime

    def tuned(self, regime: str = "masked") -> Path:
        """The model to unlearn: ``<size>/<regime>/intruction_tuned/``."""
        return self.size_dir / regime / TUNED_DIR

    def data(self, regime: str = "masked") -> Path:
        """``<size>/data-<regime>/``."""
        return self.size_dir / f"data-{regime}"

    @property
    def mask(self) -> Path:
        return self.size_dir / "masked" / MASK_FILE


def release_tables(
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    profiles: Mapping[str, Mapping[str, Any]],
    *,
    absent: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """lacuna-bench splits as the release's tables, keyed ``<Config>_<split>`` (``src/create_memorized_datasets.py``):
    per field its forget / retain rows and their paraphrased twins, ``full`` (all four); per validation field the
    validation people of the forget groups (``forget``) and of the retain groups (``retain``), a second question
    each (``*_paraphrased``, drawn with the LACUNA question template) and ``full``; ``relearn_train``.
    ``absent``: field column -> IDs left out of that field's configs (in the release, a person can be in one field's
    forget split and in no split of another field)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for fld in FIELDS.values():
        config = CONFIG_OF[fld.column]
        left_out = set((absent or {}).get(fld.column, ()))
        for split in MAIN_SPLITS:
            tables[f"{config}_{split}"] = [
                dict(r) for r in splits[split] if r["field"] == fld.column and r["ID"] not in left_out
            ]
        tables[f"{config}_full"] = [r for split in MAIN_SPLITS for r in tables[f"{config}_{split}"]]
    for fld in FIELDS.values():
        rows = [r for r in splits.get("validation", ()) if r["field"] == fld.column]
        if not rows:
            continue
        config = VALIDATION_PREFIX + CONFIG_OF[fld.column]
        for side in ("forget", "retain"):
            main = [dict(r) for r in rows if (int(r["group_id"]) in FORGET_GROUPS) == (side == "forget")]
            tables[f"{config}_{side}"] = main
            tables[f"{config}_{side}_paraphrased"] = [_second_question(r, profiles[r["ID"]], fld.key) for r in main]
        tables[f"{config}_full"] = [r for side in MAIN_SPLITS for r in tables[f"{config}_{side}"]]
    if splits.get("relearn"):
        tables["relearn_train"] = [dict(r) for r in splits["relearn"]]
    return tables


def _second_question(row: Mapping[str, Any], profile: Mapping[str, Any], key: str) -> dict[str, Any]:
    rng = random.Random(f"tiny-release|{row['ID']}|{key}")
    for _ in range(100):
        question = lacuna_question(profile, key, rng)
        if question != row["question"]:
            return {**row, "question": question}
    raise ValueError(f"no second question about {row['ID']!r} for {key!r}")


def write_card(dest: Path, names: Sequence[str]) -> Path:
    """``dest/README.md``: the dataset card of the release, one config per ``<Config>``, its files as
    ``data_files: [{split, path: data/<file>}]`` (configs in the order of the sorted file names, as published)."""
    configs: dict[str, list[dict[str, str]]] = {}
    for name in sorted(names):
        stem = name[: -len(".parquet")]
        split = next(s for s in RELEASE_SPLITS if stem.endswith("_" + s))
        configs.setdefault(stem[: -len(split) - 1], []).append({"split": split, "path": f"{DATA_SUBDIR}/{name}"})
    doc = {"configs": [{"config_name": c, "data_files": files} for c, files in configs.items()]}
    card = dest / CARD_NAME
    card.write_text("---\n" + yaml.safe_dump(doc, sort_keys=False) + "---\n# LACUNA memorized PII dataset\n")
    return card


def write_release_data(dest: Path, tables: Mapping[str, Sequence[Mapping[str, Any]]], *, card: bool = True) -> Path:
    """``dest/data/<name>.parquet`` per non-empty table, typed as published (ID, question, answer, field: string;
    group_id: int32), and the card (unless ``card`` is false). Returns ``dest``."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = datasets.Features(
        {
            "ID": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "field": datasets.Value("string"),
            "group_id": datasets.Value("int32"),
        }
    )
    (dest / DATA_SUBDIR).mkdir(parents=True, exist_ok=True)
    names = []
    for name, rows in tables.items():
        if not rows:
            continue
        # what Dataset.to_parquet writes (the features in the schema's "huggingface" metadata), without its progress bar
        table = pa.Table.from_pylist([{c: r[c] for c in features} for r in rows], schema=features.arrow_schema)
        pq.write_table(table, dest / DATA_SUBDIR / f"{name}.parquet")
        names.append(f"{name}.parquet")
    if card:
        write_card(dest, names)
    return dest


def _random_model(corpus: list[str], out: Path) -> Path:
    """A tiny random Llama and a tokenizer trained on ``corpus`` (no training of the model: seconds)."""
    import torch
    from transformers import LlamaForCausalLM

    from helpers.tiny_lm import tiny_llama_config
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(corpus, vocab_size=512)
    torch.manual_seed(0)
    config = tiny_llama_config(tokenizer, hidden_size=32, num_layers=2)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def release_mask(model: Any, *, skip_last: int = SKIP_LAST, seed: int = 42) -> dict[str, Any]:
    """``mask.pt`` of ``model`` as published: every parameter by name -> flat int32 tensor, bit g = group g; LACUNA's
    six groups drawn by the repo's builder with the release's filter; skipped tensors all-zero."""
    import torch

    from lacuna_metrics.masks import LACUNA_RELEASE_PATTERN, build_masks, named_shapes_of

    shapes = named_shapes_of(model)
    masks = build_masks(
        shapes, model.config.num_hidden_layers, skip_last=skip_last, seed=seed, pattern=LACUNA_RELEASE_PATTERN
    )
    out = {}
    for name, shape in shapes.items():
        packed = masks.packed.get(name)
        out[name] = packed.reshape(-1).clone() if packed is not None else torch.zeros(_numel(shape), dtype=torch.int32)
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _perturbed(model: Any, *, seed: int, scale: float, last_blocks: int | None) -> Any:
    """``model`` with small seeded noise added: to the last ``last_blocks`` blocks (instruction tuning: LACUNA's LoRA
    sits in the blocks the masks skip) or, with None, to every weight but the embeddings (another training run)."""
    import copy
    import re

    import torch

    out = copy.deepcopy(model)
    first = out.config.num_hidden_layers - (last_blocks or 0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if "embed_tokens" in name:
                continue
            layer = re.search(r"\.layers\.(\d+)\.", name)
            if last_blocks is not None and (layer is None or int(layer.group(1)) < first):
                continue
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def write_release(root: Path, *, data_dir: Path, model_dir: Path | None = None, size: str = SIZE) -> TinyRelease:
    """The whole tiny release under ``root`` (module docstring) from a lacuna-bench data directory with
    ``profiles.jsonl`` and a model (``model_dir``; None: a tiny random Llama). The same data in both regimes; the
    first Phone Number forget person (by ID) is left out of the Phone Number configs (:attr:`TinyRelease.absent`), so
    the people of the fields' forget splits differ, as they do in the release."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = load_data(data_dir)
    profiles = {str(p["Unique ID"]): p for p in read_rows(Path(data_dir) / "profiles.jsonl")}
    phone = sorted(r["ID"] for r in data.splits["forget"] if r["field"] == "Phone Number")
    tables = release_tables(data.splits, profiles, absent={"Phone Number": phone[:1]})
    size_dir = Path(root) / size
    for regime in REGIMES:
        write_release_data(size_dir / f"data-{regime}", tables)

    if model_dir is None:
        corpus = [r["question"] + " " + r["answer"] for rows in data.splits.values() for r in rows]
        model_dir = _random_model(corpus, Path(tempfile.mkdtemp(prefix="tiny-random-model-")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cpt = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    models = {
        "masked": cpt,
        "unmasked": _perturbed(cpt, seed=1, scale=1e-3, last_blocks=None),  # ordinary continual pretraining
    }
    for i, (regime, model) in enumerate(models.items()):
        model.save_pretrained(size_dir / regime)
        tokenizer.save_pretrained(size_dir / regime)
        tuned = _perturbed(model, seed=10 + i, scale=1e-3, last_blocks=SKIP_LAST)
        tuned.save_pretrained(size_dir / regime / TUNED_DIR)
        tokenizer.save_pretrained(size_dir / regime / TUNED_DIR)
    torch.save(release_mask(cpt), size_dir / "masked" / MASK_FILE)
    return TinyRelease(root=Path(root), size_dir=size_dir, tables=tables, absent={"Phone Number": phone[:1]})
