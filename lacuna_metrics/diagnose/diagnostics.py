"""Representation diagnostics: did unlearning move the features, or only the read-out?
(docs/definitions.md#representation-diagnostics)

"Unlearning Isn't Deletion" compares a reference (original) model with an updated (unlearned or relearned) model on
the same query texts: per layer, the agreement of the first principal directions (PCA similarity), the shift
of the updated centroid in the reference PCA plane (PCA shift, summarised by the mean PCA distance),
linear CKA, and the diagonal empirical Fisher. High PCA-sim / CKA and a small PCA distance mean the
features survived, which is the paper's supporting evidence that forgetting is reversible.

Differences from the authors' toolkit (each switchable or documented where it matters):

* pooling: the toolkit averages over ALL positions, padding included (``pooling="mean"``, padded to
  ``max_length``), so short texts are pulled towards the pad-token representation. The default here is
  ``"masked_mean"`` (attention-mask-weighted mean). All four metrics use one pooling; the toolkit uses plain mean
  for PCA and the first token for CKA (``pooling="first"``).
* layers: ``output_hidden_states`` indices 0 (embedding output) … L for every per-layer metric. The toolkit's CKA
  layer ``model.layers.{l}`` is our layer l+1 (for the last layer HF applies the final norm to the returned state).
  The mean PCA distance averages the L transformer layers 1 … L, as the paper's formula does (not the embedding
  output).
* PCA similarity is ``|cos|`` by default: the sign of a principal component is arbitrary.
* Fisher: pad labels are ``-100`` by default (the toolkit trains on pad tokens: ``labels="toolkit"``), and the layer
  of a parameter is found by exact module prefix (the toolkit's substring test puts ``model.layers.10`` into
  layer 1).

This module assembles the report (``diagnose.json`` and its plots) from the probes of a loaded model
(:mod:`lacuna_metrics.diagnose.probes`: hidden features, Fisher) and the comparisons of two feature sets
(:mod:`lacuna_metrics.diagnose.similarity`: PCA, CKA); every public name stays importable from here.

Definitions: ``docs/definitions.md#representation-diagnostics``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.diagnose.probes import (
    FISHER_LABELS,
    FISHER_QUANTILES,
    POOLINGS,
    _check_texts,
    empirical_fisher,
    fisher_diagonal,
    hidden_features,
)
from lacuna_metrics.diagnose.similarity import Array, linear_cka, mean_pca_distance, pca_shift, pca_similarity
from lacuna_metrics.manifest import build_manifest, save_figure
from lacuna_metrics.schemas import SCHEMAS, schema_stamp

__all__ = [
    "FISHER_LABELS",
    "FISHER_QUANTILES",
    "POOLINGS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "diagnose_models",
    "empirical_fisher",
    "fisher_diagonal",
    "hidden_features",
    "linear_cka",
    "mean_pca_distance",
    "pca_shift",
    "pca_similarity",
    "write_diagnose_plots",
]

#: diagnose.json's schema name and version, declared once in :data:`lacuna_metrics.schemas.SCHEMAS`.
SCHEMA, SCHEMA_VERSION = SCHEMAS["diagnose"]
#: Extra text tokenized by both tokenizers when checking that they agree.
_PROBE_TEXT = "Q: What is the email address of Jane Doe-Smith?\nA: jane.doe42@example.org, phone +1 (555) 010-9999\n"


# -- end to end ---------------------------------------------------------------------------------------------


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def _load_config(path: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def _load_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    return model.eval()


def _check_tokenizers(ref_path: Path, ref_tok: Any, upd_path: Path, upd_tok: Any, texts: list[str]) -> None:
    if ref_tok.get_vocab() != upd_tok.get_vocab():
        raise ValueError(
            f"tokenizers differ: the vocabularies of {ref_path} ({len(ref_tok)} tokens) and {upd_path} "
            f"({len(upd_tok)} tokens) are not the same; representations of different tokenizations are not comparable"
        )
    for text in [*texts[:8], _PROBE_TEXT]:
        if ref_tok(text)["input_ids"] != upd_tok(text)["input_ids"]:
            raise ValueError(f"tokenizers differ: {ref_path} and {upd_path} tokenize {text[:60]!r} differently")


def _check_configs(ref_path: Path, ref_cfg: Any, upd_path: Path, upd_cfg: Any) -> None:
    for key in ("model_type", "num_hidden_layers", "hidden_size"):
        a, b = getattr(ref_cfg, key, None), getattr(upd_cfg, key, None)
        if a != b:
            raise ValueError(f"architectures differ: {key} is {a!r} in {ref_path} but {b!r} in {upd_path}")


def _finite(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _texts_fingerprint(texts: list[str]) -> str:
    payload = json.dumps(texts, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def _compare(h_ref: list[Array], h_upd: list[Array], *, use_pc2: bool, layers: Sequence[int] | None) -> dict[str, Any]:
    if len(h_ref) != len(h_upd):
        raise ValueError(f"layer counts differ: {len(h_ref)} vs {len(h_upd)}")
    rows, shifts, notes = [], [], []
    for layer, (a, b) in enumerate(zip(h_ref, h_upd, strict=True)):
        shift = pca_shift(a, b)
        shifts.append(shift)
        row = {
            "layer": layer,
            "pca_sim": pca_similarity(a, b),
            "pca_sim_signed": pca_similarity(a, b, absolute=False),
            "delta_pc1": shift[0],
            "pc2_ref": shift[1],
            "pc2_upd": shift[2],
            "pca_distance": math.hypot(shift[0], shift[2] - shift[1]) if use_pc2 else abs(shift[0]),
            "cka": linear_cka(a, b),
        }
        bad = [k for k, v in row.items() if k != "layer" and not math.isfinite(v)]
        if bad:
            notes.append(f"layer {layer}: {', '.join(bad)} undefined (too few texts or constant features)")
        rows.append({k: (v if k == "layer" else _finite(v)) for k, v in row.items()})
    return {
        "per_layer": rows,
        "mean_pca_distance": _finite(mean_pca_distance(shifts, use_pc2=use_pc2, layers=layers)),  # 1..L by default
        "notes": notes,
    }


def diagnose_models(
    reference_dir: str | os.PathLike[str],
    updated_dirs: Sequence[str | os.PathLike[str]],
    texts: Sequence[str],
    *,
    pooling: str = "masked_mean",
    max_length: int = 128,
    batch_size: int = 16,
    fisher: bool = True,
    fisher_batch_size: int = 4,
    fisher_num_batches: int = 10,
    fisher_labels: str = "masked",
    use_pc2: bool = True,
    distance_layers: Sequence[int] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    plots: bool = False,
) -> dict[str, Any]:
    """Representation diagnostics of each updated model against the reference on ``texts``
    (docs/definitions.md#representation-diagnostics).

    Returns (and, with ``out_dir``, writes atomically to ``out_dir/diagnose.json``) a JSON-able dict, schema
    :data:`SCHEMA` version :data:`SCHEMA_VERSION`: per updated model and layer ``pca_sim`` (|cos|), ``pca_sim_signed``,
    ``delta_pc1``, ``pc2_ref``, ``pc2_upd``, ``pca_distance``, ``cka``; ``mean_pca_distance`` (over the transformer
    layers 1 … L, docs/definitions.md#representation-diagnostics); Fisher summaries of reference and updated
    (:func:`fisher_diagonal`); the options and a manifest. Undefined values (degenerate PCA/CKA) are ``null`` with a
    note. ``plots=True`` adds ``out_dir/plots/diagnose_layers.png`` and ``out_dir/plots/diagnose_pca_shift.png``. Models
    load from local files only, without remote code; the reference's features are computed first and the reference is
    freed, then the updated models are loaded one at a time. Tokenizers and configs (model_type, num_hidden_layers,
    hidden_size) of every updated model are checked against the reference before any weights are loaded (ValueError
    naming both paths).
    """
    started = time.time()
    who = "diagnose"
    texts = _check_texts(texts, who)
    if pooling not in POOLINGS:
        raise ValueError(f"{who}: unknown pooling {pooling!r}; expected one of {list(POOLINGS)}")
    if fisher_labels not in FISHER_LABELS:
        raise ValueError(f"{who}: unknown fisher_labels {fisher_labels!r}; expected one of {list(FISHER_LABELS)}")
    ref_path = Path(reference_dir)
    upd_paths = [Path(p) for p in updated_dirs]
    if not upd_paths:
        raise ValueError(f"{who}: no updated model given")
    for path in [ref_path, *upd_paths]:
        if not path.is_dir():
            raise FileNotFoundError(f"model directory not found: {path}")
    if plots and out_dir is None:
        raise ValueError(f"{who}: plots=True needs out_dir")

    ref_tok, ref_cfg = _load_tokenizer(ref_path), _load_config(ref_path)
    for path in upd_paths:  # fail fast, before any weights are loaded
        _check_configs(ref_path, ref_cfg, path, _load_config(path))
        _check_tokenizers(ref_path, ref_tok, path, _load_tokenizer(path), texts)

    n_states = getattr(ref_cfg, "num_hidden_layers", None)
    if distance_layers is not None and n_states is not None:  # fail before the forward passes, not after
        mean_pca_distance([(0.0, 0.0, 0.0)] * (n_states + 1), layers=distance_layers)

    feature_opts = {"pooling": pooling, "max_length": max_length, "batch_size": batch_size}
    fisher_opts = {
        "batch_size": fisher_batch_size,
        "num_batches": fisher_num_batches,
        "max_length": max_length,
        "labels": fisher_labels,
    }
    model = _load_model(ref_path)
    try:
        h_ref = hidden_features(model, ref_tok, texts, **feature_opts)
        ref_fisher = fisher_diagonal(model, ref_tok, texts, **fisher_opts) if fisher else None
    finally:
        del model
        gc.collect()

    updated = []
    for path in upd_paths:
        tok = _load_tokenizer(path)
        model = _load_model(path)
        try:
            h_upd = hidden_features(model, tok, texts, **feature_opts)
            upd_fisher = fisher_diagonal(model, tok, texts, **fisher_opts) if fisher else None
        finally:
            del model
            gc.collect()
        updated.append(
            {"path": str(path), **_compare(h_ref, h_upd, use_pc2=use_pc2, layers=distance_layers), "fisher": upd_fisher}
        )

    stamp = schema_stamp("diagnose")
    result: dict[str, Any] = {
        "schema": stamp["name"],  # diagnose.json's flat shape since version 1: "schema": name, "version": n
        "version": stamp["version"],
        "reference": {"path": str(ref_path), "fisher": ref_fisher},
        "updated": updated,
        "layers": list(range(len(h_ref))),
        "options": {
            **feature_opts,
            "pca_similarity": "absolute cosine (pca_sim); signed in pca_sim_signed",
            "cka_features": f"pooled hidden states ({pooling}), layers 0..L",
            "mean_pca_distance": {
                "use_pc2": use_pc2,
                # hidden-state indices averaged: the L transformer layers 1..L unless distance_layers chose others
                "layers": list(range(1, len(h_ref))) if distance_layers is None else list(distance_layers),
                "definition": "mean over the transformer layers 1..L of the centroid distance in the reference PC1-PC2 "
                "plane (docs/definitions.md#representation-diagnostics)",
            },
            "fisher": fisher_opts if fisher else None,
        },
        "manifest": build_manifest(
            num_texts=len(texts),
            texts_fingerprint=_texts_fingerprint(texts),
            wall_seconds=round(time.time() - started, 3),
        ),
    }
    if out_dir is not None:  # the JSON and its plots appear together, or nothing does
        from lacuna_metrics.manifest import publish_together, write_json

        out = Path(out_dir)
        with publish_together(out) as staging:
            if plots:
                written = write_diagnose_plots(result, staging / "plots")
                result["manifest"]["plots"] = [str(out / p.relative_to(staging)) for p in written]
            write_json(staging / "diagnose.json", result)
    return result


# -- plots --------------------------------------------------------------------------------------------------


def write_diagnose_plots(result: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """``diagnose_layers.png`` (PCA-sim and CKA vs layer, one line per updated model) and ``diagnose_pca_shift.png``
    (per layer: the reference centroid at (0, PC2_ref) and each updated model at (dPC1, PC2_upd))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    nan = float("nan")

    def val(v: Any) -> float:
        return nan if v is None else float(v)

    layers = result["layers"]
    labels = [Path(u["path"]).name or u["path"] for u in result["updated"]]
    if len(set(labels)) < len(labels):  # e.g. run1/model and run2/model
        labels = [u["path"] for u in result["updated"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "pca_sim", "PCA similarity |cos(PC1)|"), (axes[1], "cka", "linear CKA")):
        for label, upd in zip(labels, result["updated"], strict=True):
            ax.plot(layers, [val(r[key]) for r in upd["per_layer"]], marker="o", label=label)
        ax.set(title=title, xlabel="layer (0 = embeddings)", ylim=(-0.02, 1.02))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.tight_layout()
    written = [save_figure(fig, out / "diagnose_layers.png")]

    ncols = min(6, len(layers))
    nrows = math.ceil(len(layers) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3 * ncols, 2.8 * nrows), squeeze=False)
    for layer in layers:
        ax = axes[layer // ncols][layer % ncols]
        first = result["updated"][0]["per_layer"][layer]
        ax.scatter([0.0], [val(first["pc2_ref"])], marker="x", color="black", label="reference")
        for label, upd in zip(labels, result["updated"], strict=True):
            row = upd["per_layer"][layer]
            ax.scatter([val(row["delta_pc1"])], [val(row["pc2_upd"])], label=label)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("ΔPC1", fontsize=8)
        ax.set_ylabel("PC2", fontsize=8)
    for k in range(len(layers), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    written.append(save_figure(fig, out / "diagnose_pca_shift.png"))
    return written
