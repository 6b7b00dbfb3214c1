"""Regression tests for tied |δ| in ``qtile`` (and ``crossfield``, per-layer AUCs): ties must not become signal.

The bug: the release code ranks tied |δ| (unchanged scalars, bf16-quantized deltas) in index order, so with masks
that have structure (whole rows, heads or neurons) an *after* checkpoint identical to *before* got AUC(F) = 1.000
through ``qtile``, and untargeted bf16 noise 0.74. Average ranks (``qtile_ties="average"``, the default) keep ties
tied; ``"ordinal"`` is the release behaviour, kept for comparison with the paper (docs/scoring.md).

Every test goes through the public scorer (:func:`lacuna_metrics.score.score_pair`) on tiny Llama-like checkpoints
written as real safetensors files, with masks whose groups cover whole rows, blocks of rows (heads) or columns
(neurons). The kernels themselves are tested against scipy's average ranks in tests/metrics/test_kernels.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from lacuna_metrics.localization.precision import SCORES, LocalizationConfig
from lacuna_metrics.masks import MaskSet, component, save_masks
from lacuna_metrics.score import score_pair

TARGETS = ("forget", "unified", "forget_vs_retain")
TARGET_CLASSES = (("forget", (2,), (0, 1)), ("unified", (1, 2), (0,)), ("forget_vs_retain", (2,), (1,)))
FORGET_BITS, RETAIN_BITS = (0, 2, 4), (1, 3, 5)
HEAD_ROWS = 8  # rows per "head" block
FIELDS = 4  # per-field runs for crossfield (LACUNA: four)
#: Scores that read the update (and the control run's update) only: chance under untargeted noise.
UPDATE_ONLY = tuple(s for s in SCORES if s != "reversal")
STRUCTURES = ("rows", "heads", "neurons")


def shapes(layers: int = 3, hidden: int = 128, inter: int = 256) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (64, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (hidden,)
        out[p + "self_attn.q_proj.weight"] = (hidden, hidden)
        out[p + "self_attn.k_proj.weight"] = (hidden // 2, hidden)
        out[p + "self_attn.v_proj.weight"] = (hidden // 2, hidden)
        out[p + "self_attn.o_proj.weight"] = (hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = (inter, hidden)
        out[p + "mlp.up_proj.weight"] = (inter, hidden)
        out[p + "mlp.down_proj.weight"] = (hidden, inter)
    out["model.norm.weight"] = (hidden,)
    return out


def structured_mask(rng: np.random.Generator, shape: tuple[int, int], structure: str) -> np.ndarray:
    """Packed group bits whose groups cover whole units: rows, blocks of ``HEAD_ROWS`` rows, or columns.

    ``rows``/``heads``/``neurons``: each unit is forget (20%), retain (20%) or unmasked, in random places, with
    at least one forget and one other unit per tensor. ``tail``: the last fifth of the rows is forget and the
    middle fifth retain, as masks built for the last heads of a layer are."""
    rows, cols = shape
    if structure == "tail":
        unit_of = np.repeat(np.arange(rows), cols).reshape(shape)
        kind = np.zeros(rows, dtype=np.int64)
        kind[rows - rows // 5 :] = 2
        kind[2 * rows // 5 : 3 * rows // 5] = 1
    else:
        if structure == "rows":
            units, unit_of = rows, np.repeat(np.arange(rows), cols).reshape(shape)
        elif structure == "heads":
            units, unit_of = rows // HEAD_ROWS, np.repeat(np.arange(rows) // HEAD_ROWS, cols).reshape(shape)
        elif structure == "neurons":
            units, unit_of = cols, np.tile(np.arange(cols), rows).reshape(shape)
        else:
            raise AssertionError(structure)
        kind = rng.choice(3, units, p=[0.6, 0.2, 0.2])  # 0 none, 1 retain, 2 forget
        kind[rng.choice(units, 2, replace=False)] = [2, 0]
    bits = np.where(
        kind == 2,
        1 << rng.choice(FORGET_BITS, kind.size),
        np.where(kind == 1, 1 << rng.choice(RETAIN_BITS, kind.size), 0),
    )
    return bits[unit_of].astype(np.int32)


def average_qtile(delta: np.ndarray) -> np.ndarray:
    """Reference qtile: scipy's average ranks (1-based) − 1 over n − 1, float32."""
    return ((rankdata(delta, method="average") - 1.0) / (delta.size - 1)).astype(np.float32)


def category(packed: np.ndarray) -> np.ndarray:
    """0 outside, 1 retain, 2 forget (forget wins), flat."""
    flat = packed.reshape(-1)
    forget = (flat & sum(1 << b for b in FORGET_BITS)) != 0
    retain = (flat & sum(1 << b for b in RETAIN_BITS)) != 0
    return np.where(forget, 2, np.where(retain, 1, 0)).astype(np.uint8)


def as_stored(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float32 values exactly as a ``dtype`` checkpoint stores them (bf16: quantized)."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dtype).to(torch.float32).numpy()


@dataclass
class Pair:
    paths: dict[str, Path]
    masks: Path
    values: dict[str, dict[str, np.ndarray]]  # label -> name -> float32 values as stored
    cats: dict[str, np.ndarray]  # masked tensor -> flat categories
    dtype: str = ""

    def score(self, config: LocalizationConfig) -> dict[str, Any]:
        return score_pair(
            self.paths["after"],
            before=self.paths["before"],
            masks=self.masks,
            base=self.paths["base"],
            control_before=self.paths["control_before"],
            control_after=self.paths["control_after"],
            crossfield=[self.paths[f"field{i}"] for i in range(FIELDS)],
            frag=False,
            progress=False,
            config=config,
        )


def make_pair(root: Path, structure: str, update: str, dtype: torch.dtype, seed: int = 0) -> Pair:
    """A before/after pair with a base (an injection on the masked scalars, as masked pretraining leaves), an
    unmasked control pair and ``FIELDS`` per-field runs. ``update="zero"``: every after-checkpoint equals its
    before (the control's and the fields' too); ``"noise"``: each gets independent Gaussian noise on every weight,
    stored in ``dtype`` (bf16: quantized, so most |δ| are a few exact values, many zero)."""
    rng = np.random.default_rng(seed)
    sizes = shapes()
    packed = {
        n: structured_mask(rng, s, structure) for n, s in sizes.items() if len(s) == 2 and component(n) is not None
    }
    values: dict[str, dict[str, np.ndarray]] = {
        k: {}
        for k in ("before", "after", "base", "control_before", "control_after", *(f"field{i}" for i in range(FIELDS)))
    }
    noise = 1e-4  # below half a bf16 ulp of most weights (~0.02): many bf16 deltas are 0, the rest few values

    def moved(x: np.ndarray) -> np.ndarray:
        return as_stored(x + rng.standard_normal(x.size) * noise if update == "noise" else x, dtype)

    for name, shape in sizes.items():
        n = math.prod(shape)
        before = as_stored(rng.standard_normal(n) * 0.02, dtype)
        inj = np.where(packed[name].reshape(-1) != 0, rng.standard_normal(n) * 0.01, 0.0) if name in packed else 0.0
        values["before"][name] = before
        values["base"][name] = as_stored(before - inj, dtype)
        values["after"][name] = moved(before)
        control = as_stored(rng.standard_normal(n) * 0.02, dtype)
        values["control_before"][name], values["control_after"][name] = control, moved(control)
        for i in range(FIELDS):
            values[f"field{i}"][name] = moved(before)
    paths = {}
    for label, tensors in values.items():
        paths[label] = root / label
        paths[label].mkdir(parents=True)
        stored = {n: torch.from_numpy(v.reshape(sizes[n])).to(dtype).contiguous() for n, v in tensors.items()}
        save_file(stored, str(paths[label] / "model.safetensors"), metadata={"format": "pt"})
    masks = save_masks(MaskSet({n: torch.from_numpy(p) for n, p in packed.items()}), root / "masks.safetensors")
    return Pair(paths, masks, values, {n: category(p) for n, p in packed.items()})


def config(**kwargs: Any) -> LocalizationConfig:
    return LocalizationConfig(composite_samples=50_000, **kwargs)


def assert_every_family(result: dict[str, Any], check) -> None:
    """``check(target, score, auc)`` for every score family of docs/definitions.md#localization-precision and the
    composite."""
    assert result["not_applicable"] == {}
    for target in TARGETS:
        aucs = result["auc"][target]
        assert set(aucs) == {*SCORES, "composite", "best"}
        for s in (*SCORES, "composite"):
            check(target, s, aucs[s])


# -- a zero update ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("structure", [*STRUCTURES, "tail"])
def test_zero_update_scores_one_half_everywhere(tmp_path, structure):
    """after == before (and the control's and every field's after == their before): nothing moved, so every
    score family, the composite, the best of them and every per-layer AUC is 0.5 or null, for every target."""
    pair = make_pair(tmp_path, structure, "zero", torch.bfloat16)
    result = pair.score(config())
    assert result["localization_settings"]["qtile_ties"] == "average"

    def one_half_or_null(target: str, s: str, auc: float | None) -> None:
        assert auc is None or auc == pytest.approx(0.5, abs=1e-9), (target, s, auc)

    assert_every_family(result, one_half_or_null)
    for target in TARGETS:
        one_half_or_null(target, "best", result["auc"][target]["best"]["value"])
    for row in result["per_layer"]:
        for target in TARGETS:
            one_half_or_null(target, f"per_layer {row['layer']} {row['component']}", row["auc"][target])


@pytest.mark.parametrize("structure", ["tail", "heads"])
def test_ordinal_ties_reproduce_the_release_bug(tmp_path, structure):
    """``qtile_ties="ordinal"`` is the release code's stable argsort: with the zero update, qtile (and crossfield)
    rank the tied zeros in index order, so masks on the last rows look perfectly localized, and ``best`` picks
    it; with random heads it is off 0.5 too. Average ranks give 0.5 on the same files."""
    pair = make_pair(tmp_path, structure, "zero", torch.bfloat16)
    ordinal = pair.score(config(qtile_ties="ordinal"))
    assert ordinal["localization_settings"]["qtile_ties"] == "ordinal"
    assert ordinal["manifest"]["config"]["qtile_ties"] == "ordinal"
    for target in TARGETS:
        for s in SCORES:
            if s not in ("qtile", "crossfield"):
                assert ordinal["auc"][target][s] == pytest.approx(0.5, abs=1e-9), (target, s)
    # the reference: the index over n − 1 per tensor, as float32
    names = list(ordinal["universe"]["names"])
    index_q = np.concatenate(
        [(np.arange(pair.cats[n].size) / (pair.cats[n].size - 1)).astype(np.float32) for n in names]
    )
    cats = np.concatenate([pair.cats[n] for n in names])
    expected = roc_auc_score(cats == 2, index_q)
    for s in ("qtile", "crossfield"):
        assert ordinal["auc"]["forget"][s] == pytest.approx(expected, abs=1e-9)
    if structure == "tail":
        assert ordinal["auc"]["forget"]["qtile"] > 0.99
        assert ordinal["auc"]["forget"]["best"]["value"] > 0.99
        assert ordinal["auc"]["forget"]["best"]["score"] in ("qtile", "crossfield")
        assert min(row["auc"]["forget"] for row in ordinal["per_layer"]) > 0.99
    else:
        assert abs(expected - 0.5) > 0.01  # random heads: where they happen to sit in the tensors
    average = pair.score(config(scores=("qtile", "crossfield")))
    for target in TARGETS:
        assert average["auc"][target]["qtile"] == average["auc"][target]["crossfield"] == 0.5


# -- untargeted noise ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[(s, d) for d in ("bfloat16", "float32") for s in STRUCTURES])
def noise_run(request, tmp_path_factory):
    structure, dtype = request.param
    pair = make_pair(tmp_path_factory.mktemp(f"noise_{structure}_{dtype}"), structure, "noise", getattr(torch, dtype))
    pair.dtype = dtype
    return pair, pair.score(config())


def test_untargeted_noise_is_chance_for_every_score_that_reads_the_update(noise_run):
    """Independent Gaussian noise on every weight (the control's and every field's too) carries no information
    about the masks, so every family that reads only the update is 0.5 ± 0.02 for every target: the universe
    (~435k scalars, ~20% forget, 21 tensors) is big enough that the scalar-level sampling error is ~0.003.

    ``crossfield`` gets ± 0.03: in bf16 most scalars are unchanged in at least one of the four fields, and their
    crossfield is that field's zero run's average rank over n − 1 (≈ half the tensor's share of zeros), one
    value per tensor that differs between tensors by sampling. Pooled, such values order whole tensors, so the
    AUC carries a tensor-level error (it shrinks with the number of tensors, not with their size; head masks with
    few heads per tensor make the tensors' class shares unequal). Its value is the definition's (checked
    against the brute-force reference), and with ordinal ranks the error is as large, plus index order."""
    pair, result = noise_run

    def chance(target: str, s: str, auc: float | None) -> None:
        if s in UPDATE_ONLY:
            assert auc == pytest.approx(0.5, abs=0.03 if s == "crossfield" else 0.02), (target, s, auc)

    assert_every_family(result, chance)
    names = result["universe"]["names"]
    v = pair.values
    crossfield = np.concatenate(
        [
            np.minimum.reduce([average_qtile(np.abs(v[f"field{i}"][n] - v["before"][n])) for i in range(FIELDS)])
            for n in names
        ]
    )
    cats = np.concatenate([pair.cats[n] for n in names])
    for target, pos, neg in TARGET_CLASSES:
        keep = np.isin(cats, pos + neg)
        expected = roc_auc_score(np.isin(cats[keep], pos), crossfield[keep])
        assert result["auc"][target]["crossfield"] == pytest.approx(expected, abs=1e-9), target
    for target in TARGETS:
        assert result["baselines"][target]["before_magnitude"] == pytest.approx(0.5, abs=0.02)
    for row in result["per_layer"]:  # groups of 32k-100k scalars: a looser bound
        for target in TARGETS:
            assert row["auc"][target] == pytest.approx(0.5, abs=0.05), (row["layer"], row["component"], target)


def test_untargeted_bf16_noise_is_the_tie_case(noise_run):
    """The bf16 runs really are the tie case (a third of |δ| exactly zero, the rest few distinct values), the
    float32 runs the no-tie case, and raw reads no signal from either."""
    pair, result = noise_run
    delta = np.concatenate([np.abs(pair.values["after"][n] - pair.values["before"][n]) for n in pair.cats])
    if pair.dtype == "bfloat16":
        assert (delta == 0).mean() > 0.25
        assert np.unique(delta).size < delta.size / 100
    else:
        assert (delta == 0).mean() < 0.01
        assert np.unique(delta).size > delta.size / 4
    for target in TARGETS:
        assert result["auc"][target]["raw"] == pytest.approx(0.5, abs=0.01)


def test_untargeted_noise_reversal_and_composite_read_the_injection(noise_run):
    """``reversal`` = (|inj| − |Δ + inj|) / (|inj| + ε), inj = before − base, reads the injection as well as the
    update: where nothing was injected (every unmasked scalar here) any change scores about −|Δ|·10¹⁰, where
    something was, about 0. So under untargeted noise it separates injected from uninjected scalars: targets
    whose negatives include unmasked scalars (forget, unified) get an AUC far above 0.5, which is the formula's
    value (checked against it here), not a sign of a targeted update; ``forget_vs_retain`` (both classes
    injected alike) is chance. The composite has reversal among its features, so it follows the same pattern.
    (So with an injection-bearing ``--base``, untargeted noise gets a best AUC(F) of ~0.85 through these two: a
    property of the reversal formula, not of ties; the ``injection_magnitude`` baseline shows the footprint.)"""
    pair, result = noise_run
    names = result["universe"]["names"]
    v = pair.values
    inj = np.concatenate([v["before"][n] - v["base"][n] for n in names])
    d = np.concatenate([v["after"][n] - v["before"][n] for n in names])
    reversal = (np.abs(inj) - np.abs(d + inj)) / (np.abs(inj) + np.float32(1e-10))
    cats = np.concatenate([pair.cats[n] for n in names])
    for target, pos, neg in TARGET_CLASSES:
        keep = np.isin(cats, pos + neg)
        expected = roc_auc_score(np.isin(cats[keep], pos), reversal[keep].astype(np.float64))
        assert result["auc"][target]["reversal"] == pytest.approx(expected, abs=1e-9), target
    assert result["auc"]["forget_vs_retain"]["reversal"] == pytest.approx(0.5, abs=0.02)
    # the composite's out-of-fold AUC under no signal scatters more (0.45-0.50 on these files): its folds are
    # unshuffled stratified blocks of whole tensors (spec), and per-group/per-tensor features (layernorm,
    # compnorm) let each fold learn chance differences between tensors that do not carry over to the held-out ones
    assert result["auc"]["forget_vs_retain"]["composite"] == pytest.approx(0.5, abs=0.06)
    for target in ("forget", "unified"):  # far above chance without any targeting: the injection's footprint
        assert result["auc"][target]["reversal"] > 0.7 and result["auc"][target]["composite"] > 0.7
    assert result["baselines"]["unified"]["injection_magnitude"] > 0.99  # where the injection is: the masks


@pytest.mark.parametrize("structure", ["tail"])
def test_ordinal_ties_turn_bf16_noise_into_signal(tmp_path, structure):
    """The issue's second case: untargeted bf16 noise, raw 0.50 but ordinal qtile well above it (index order
    inside the big run of zero |δ|); average ranks keep it at chance."""
    pair = make_pair(tmp_path, structure, "noise", torch.bfloat16)
    ordinal = pair.score(config(qtile_ties="ordinal", scores=("raw", "qtile")))
    assert ordinal["auc"]["forget"]["raw"] == pytest.approx(0.5, abs=0.02)
    assert ordinal["auc"]["forget"]["qtile"] > 0.58  # a third of |δ| is zero here; more zeros, more signal
    average = pair.score(config(scores=("raw", "qtile")))
    assert average["auc"]["forget"]["qtile"] == pytest.approx(0.5, abs=0.02)
    assert average["auc"]["forget"]["raw"] == ordinal["auc"]["forget"]["raw"]


@pytest.mark.parametrize("ties", ["average", "ordinal", None])
def test_cli_flag_is_recorded_and_explained(tmp_path, ties, capsys):
    """``lacuna score --qtile-ties`` reaches the scorer (default: average), lands in score.json's settings and
    manifest config, and score.md says how ties counted."""
    import json

    from lacuna_unlearn.bench.cli.main import main

    pair = make_pair(tmp_path, "tail", "zero", torch.bfloat16)
    out = tmp_path / "out"
    argv = ["score", "--before", str(pair.paths["before"]), "--after", str(pair.paths["after"])]
    argv += ["--masks", str(pair.masks), "--no-frag", "--quiet", "--scores", "raw,qtile", "--out", str(out)]
    argv += ["--composite-samples", "0"] + (["--qtile-ties", ties] if ties else [])
    assert main(argv) == 0
    capsys.readouterr()
    result = json.loads((out / "score.json").read_text())
    expected = ties or "average"
    assert result["localization_settings"]["qtile_ties"] == expected
    assert result["manifest"]["config"]["qtile_ties"] == expected
    assert result["auc"]["forget"]["qtile"] == (0.5 if expected == "average" else pytest.approx(1.0, abs=0.01))
    summary = (out / "score.md").read_text()
    assert ("stay tied" in summary) == (expected == "average")
    assert ("index order" in summary) == (expected == "ordinal")
