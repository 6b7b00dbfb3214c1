"""Results in LACUNA's own key names (docs/release.md, "Results in LACUNA's key names").

LACUNA's evaluation release (McGill-NLP/LACUNA) writes, per field and method under ``<size>/<regime>/``:
``unlearned_models/<Field>/<Method>/Panorama_SUMMARY.json`` (``src/eval.py``), ``.../extraction_leakage.json``
(``scripts/extraction_leakage.py``) and ``cached_notebook_files/precision_metrics/<target>/<Field>/<Method>/
metrics.json`` (``scripts/precision_metrics.py``). :data:`KEYS` is the one table from each of their keys to the
lacuna-bench key it is read from (a dotted path in a ``results.json`` method entry and/or in a ``score.json``) and
the transform between them; the writers below and the docs test read it, so a key is declared once. A key
lacuna-bench does not compute is in the table with no source and is never written (absent, not null).

Each file gets a sidecar ``<name>.provenance.json`` saying that lacuna-bench wrote it, from which result, which
keys came from where, which were left out and why, and how each written key's definition differs from LACUNA's
(:data:`NOTES`). A sidecar rather than a key inside the file, so LACUNA's notebook reads the files as its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "KEYS",
    "LACUNA_FAMILIES",
    "LACUNA_TARGETS",
    "NOTES",
    "LacunaKey",
    "bench_field",
    "bench_method",
    "lacuna_field",
    "lacuna_method",
    "place_checkpoint",
    "run_lacuna_files",
    "score_lacuna_files",
    "split_layout",
]

PANORAMA, PRECISION, LEAKAGE = "Panorama_SUMMARY.json", "metrics.json", "extraction_leakage.json"
#: The one source path that is the run's context, not a result: a file holding nothing else is not written.
_FIELD = "field"
#: The targets ``precision_metrics.py`` writes a ``metrics.json`` for (lacuna-bench's ``forget_vs_retain`` has none).
LACUNA_TARGETS = ("forget", "unified")
#: The scoring families of ``precision_metrics.py`` in the order its ``metrics.json`` lists them (``ALL_METRICS``);
#: every one is also a lacuna-bench family of the same name and formula (docs/definitions.md#localization-precision).
LACUNA_FAMILIES = (
    "raw", "qtile", "compnorm", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm",
    "eratio", "contrastln", "composite", "crossfield",
)  # fmt: skip

#: Each difference between a LACUNA key's definition and the lacuna-bench figure written under it, by id (the ids
#: are the notes of docs/release.md's tables, which say more).
NOTES: dict[str, str] = {
    "label_split": "prompt ending: OpenUnlearning labels the tokens after tokenizer('Q: q\\nA: ') (trailing space), "
    "which leaves the first answer token unscored where the tokenizer merges the space into it (OLMo's BPE); "
    "lacuna-bench scores every answer token (lm-eval's split: the space belongs to the answer)",
    "rows": "aggregation over persons: both average over the split's rows, one per person; lacuna-bench's rows are "
    "its data's forget/retain people of the field",
    "probe_prompt": "prompt ending: LACUNA probes 'Q: q\\nA: ', lacuna-bench 'Q: q\\nA:' (the space is left to the "
    "model; attack.json probe.prompt_deviation)",
    "judge": "judge: LACUNA counts a leak when str(profile value).lower() is a substring of the lower-cased 20-token "
    "generation; lacuna-bench under judge 'lacuna' strips the answer first (other judges: see the judge below)",
    "probe_people": "persons: LACUNA probes the forget people that have a profile value; lacuna-bench its data's "
    "forget people of the field; questions seeded by SHA-256, not Python's per-process hash()",
    "rounded": "rounded to 2 decimals as LACUNA writes it (results.json keeps every digit)",
    "auc": "AUC: lacuna-bench's is the exact Mann-Whitney statistic (ties 1/2; a 2^20-bin key histogram with a "
    "reported error bound past exact_limit scalars); LACUNA's comes from a 10^6-bin adaptive histogram, in which "
    "distinct scores of one bin tie and a tensor of equal scores lands in the middle bin",
    "universe": "universe: LACUNA scores, per target, the tensors holding both classes of that target; lacuna-bench "
    "the tensors holding a forget and a non-forget scalar, for every target (the same on LACUNA's masks)",
    "ties": "tie rule: qtile ranks tied |delta| by index order in LACUNA (stable argsort); lacuna-bench does so with "
    "qtile_ties=ordinal, and gives ties their average rank by default (see settings.qtile_ties)",
    "sigma": "sigma: LACUNA's (layer, attention) group also holds OLMo2's self_attn.q_norm/k_norm (its name rule "
    "reads 'self_attn' before 'norm'); lacuna-bench's attention/MLP groups hold no norm",
    "control": "no control run: LACUNA falls back (compnorm, contrast, eratio, contrastln rank like raw; "
    "contrastnorm is constant), lacuna-bench leaves the key out",
    "reference": "reference checkpoint: LACUNA's inj = intruction_tuned - <regime>/model.safetensors (W_cpt, zero in "
    "the scored tensors: the family is degenerate); lacuna-bench's is --base (the testbed's base/, W_pre); pass "
    "--base <regime>/model.safetensors for LACUNA's",
    "crossfield_runs": "crossfield: LACUNA takes the minimum over the same method's runs on all four fields (the "
    "scored one included); lacuna-bench over the --crossfield runs given",
    "composite_fit": "composite: LACUNA standardises the whole subsample before the folds and permutes each "
    "tensor's rows (RandomState(42).choice); lacuna-bench standardises inside each fold, rows in tensor order",
    "p_at_k": "k: LACUNA takes the top max(1, floor(f*n)) scalars, lacuna-bench ceil(f*n); both split the boundary "
    "tie pro rata",
    "layer_key": "per (layer, component) qtile AUC, keyed '<layer>_<component>' (attention, mlp) as LACUNA does",
    "field_name": "the field as LACUNA's config names it (email -> Email_Address)",
    "count": "a count of persons (results.json: k of the exact interval over persons)",
    "not_computed": "not computed by lacuna-bench",
}


@dataclass(frozen=True)
class LacunaKey:
    """One key of a LACUNA results file and where lacuna-bench holds the same quantity.

    ``run``: dotted path in a ``results.json`` method entry (``field`` is the entry's field key); ``score``: in a
    ``score.json``; ``{target}`` is filled in for precision keys. None: lacuna-bench does not compute it.
    ``transform``: a name of :data:`TRANSFORMS`. ``notes``: ids of :data:`NOTES`.
    """

    file: str
    key: str
    run: str | None
    score: str | None = None
    transform: str = "same"
    notes: tuple[str, ...] = ()


#: (side, paraphrased) -> the prefix of lacuna-bench's behaviour keys (``em``, ``retain_em``, ...; METRIC_TABLE)
_BEHAVIOUR_PREFIX = {
    ("forget", False): "",
    ("forget", True): "forget_paraphrased_",
    ("retain", False): "retain_",
    ("retain", True): "retain_paraphrased_",
}


def _panorama() -> Iterator[LacunaKey]:
    """``Panorama_SUMMARY.json``: OpenUnlearning's metric names of LACUNA's ``configs/eval/panorama.yaml``."""
    notes = ("label_split", "rows")
    for (side, paraphrased), ours in _BEHAVIOUR_PREFIX.items():
        suffix = "_paraphrased" if paraphrased else ""
        theirs = "" if side == "forget" else "retain_"  # LACUNA's forget ES/EM keys carry no side
        yield LacunaKey(PANORAMA, f"{side}_Q_A_Prob{suffix}", f"behaviour.{ours}prob", notes=notes)
        yield LacunaKey(PANORAMA, f"{side}_Q_A_ROUGE{suffix}", None, notes=("not_computed",))
        yield LacunaKey(PANORAMA, f"{theirs}extraction_strength{suffix}", f"behaviour.{ours}es", notes=notes)
        yield LacunaKey(PANORAMA, f"{theirs}exact_memorization{suffix}", f"behaviour.{ours}em", notes=notes)


#: Notes of every AUC key, and those of single families.
_AUC_NOTES = ("auc", "universe")
_FAMILY_NOTES: dict[str, tuple[str, ...]] = {
    "qtile": ("ties",),
    "layernorm": ("sigma",),
    "contrastln": ("sigma", "control"),
    "compnorm": ("control",),
    "contrast": ("control",),
    "contrastnorm": ("control",),
    "eratio": ("control",),
    "signrev": ("reference",),
    "reversal": ("reference",),
    "dirreversal": ("reference",),
    "crossfield": ("crossfield_runs", "ties"),
    "composite": ("composite_fit",),
}


def _precision() -> Iterator[LacunaKey]:
    """``metrics.json`` of ``precision_metrics.py::save_experiment``: per-layer AUCs, then ``auc_``/``pk_`` per family."""
    yield LacunaKey(
        PRECISION, "layer_aucs", "per_layer", "per_layer", "layer_aucs", ("layer_key", "ties", "auc", "universe")
    )
    for f in LACUNA_FAMILIES:
        notes = (*_AUC_NOTES, *_FAMILY_NOTES.get(f, ()))
        yield LacunaKey(PRECISION, f"auc_{f}", f"auc.{{target}}.families.{f}", f"auc.{{target}}.{f}", notes=notes)
        if f == "composite":  # lacuna-bench ranks no composite top-k
            yield LacunaKey(PRECISION, f"pk_{f}", None, None, notes=("not_computed",))
        else:
            path = f"precision_at_k.{{target}}.{f}"
            yield LacunaKey(
                PRECISION, f"pk_{f}", path, path, "p_at_k", ("p_at_k", "universe", *_FAMILY_NOTES.get(f, ()))
            )


_PROBE = ("probe_prompt", "judge", "probe_people")

#: Every key of LACUNA's three results files, in the order LACUNA writes them (Panorama_SUMMARY.json sorted).
KEYS: tuple[LacunaKey, ...] = (
    *sorted(_panorama(), key=lambda k: k.key),
    *_precision(),
    LacunaKey(LEAKAGE, "field", _FIELD, transform="field_name", notes=("field_name",)),
    LacunaKey(LEAKAGE, "attempts", "attack.attempts"),
    LacunaKey(LEAKAGE, "total_forget_people", "attack.persons", transform="count", notes=("probe_people",)),
    LacunaKey(
        LEAKAGE,
        "still_leaking_after_unlearn",
        "attack.ci.success_at_n_unlearned.k",
        transform="count",
        notes=(*_PROBE, "count"),
    ),
    LacunaKey(LEAKAGE, "forgotten_by_unlearn", "attack.forgotten", transform="count", notes=_PROBE),
    LacunaKey(LEAKAGE, "resurfaced_after_relearn", "attack.resurfaced", transform="count", notes=_PROBE),
    LacunaKey(
        LEAKAGE,
        "pct_resurfaced_of_forgotten",
        "attack.pct_resurfaced_of_forgotten",
        transform="rounded",
        notes=(*_PROBE, "rounded"),
    ),
)


def lacuna_field(field: str) -> str:
    """LACUNA's config name of a field (``email`` or ``Email Address`` -> ``Email_Address``): its PANORAMA column
    without the apostrophe, spaces as underscores, as LACUNA's data configs and output directories name it."""
    from lacuna_tasks import get_field

    return get_field(field).config


#: lacuna-bench method -> the directory LACUNA's scripts write it to (``precision_metrics.py``'s ``DIR_NAMES``,
#: the release's ``GradientAscent`` example); other methods keep their lacuna-bench name.
_METHOD_DIRS = {
    "simnpo": "SimNPO",
    "memflex": "MemFlex",
    "alpha_edit": "AlphaEdit",
    "oracle_grad": "GradDiff_OracleGrad",
    "grad_ascent": "GradientAscent",
}


def lacuna_method(method: str) -> str:
    """The directory name LACUNA's scripts use for a lacuna-bench method (``oracle_grad`` -> ``GradDiff_OracleGrad``)."""
    return _METHOD_DIRS.get(method, method)


def bench_method(method_dir: str) -> str:
    """The lacuna-bench method of a directory LACUNA's scripts wrote (``GradDiff_OracleGrad`` -> ``oracle_grad``);
    a directory name of no lacuna-bench method stays as it is."""
    return {d: m for m, d in _METHOD_DIRS.items()}.get(method_dir, method_dir)


def bench_field(field_dir: str) -> str | None:
    """The lacuna-bench field of a directory LACUNA's scripts wrote (``Email_Address`` -> ``email``; a lacuna-bench
    field name is accepted too); None for no known field."""
    from lacuna_tasks import FIELDS

    return {**{f.config: k for k, f in FIELDS.items()}, **{k: k for k in FIELDS}}.get(field_dir)


# -- transforms --------------------------------------------------------------------------------------------------


def _layer_aucs(rows: Any, target: str) -> dict[str, float] | None:
    out = {f"{r['layer']}_{r['component']}": (r.get("auc") or {}).get(target) for r in rows or ()}
    return {k: v for k, v in out.items() if v is not None} or None


def _p_at_k(shares: Any, _target: str) -> dict[str, float] | None:
    out = {f"p@{label}": v for label, v in (shares or {}).items() if v is not None}
    return out or None


#: transform name -> function(value, target) giving what LACUNA writes (None: nothing to write)
TRANSFORMS: dict[str, Callable[[Any, str], Any]] = {
    "same": lambda v, _t: v,
    "count": lambda v, _t: int(v),
    "rounded": lambda v, _t: round(float(v), 2),
    "field_name": lambda v, _t: lacuna_field(v),
    "layer_aucs": _layer_aucs,
    "p_at_k": _p_at_k,
}


def _lookup(doc: Mapping[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _fill(
    file: str, doc: Mapping[str, Any], source: str, target: str = ""
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """``file``'s content from ``doc`` (``source``: ``run`` or ``score`` paths), the lacuna-bench key of each
    written key, and why each other key was left out."""
    content: dict[str, Any] = {}
    keys: dict[str, str] = {}
    absent: dict[str, str] = {}
    for spec in (k for k in KEYS if k.file == file):
        path = getattr(spec, source)
        if path is None:
            absent[spec.key] = NOTES["not_computed"]
            continue
        path = path.format(target=target)
        raw = _lookup(doc, path)
        value = None if raw is None else TRANSFORMS[spec.transform](raw, target)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            absent[spec.key] = f"{path} is null or missing in this result"
            continue
        content[spec.key], keys[spec.key] = value, path
    return content, keys, absent


def _write(
    path: Path, content: dict[str, Any], keys: Mapping[str, str], absent: Mapping[str, str], origin: dict[str, Any]
) -> list[Path]:
    """Write ``path`` and its provenance sidecar atomically; nothing when no key but the run's field has a value
    (an entry without the attack has no leakage figures to write)."""
    from lacuna_metrics import package_versions, schema_stamp, write_json

    if not set(keys.values()) - {_FIELD}:
        return []
    used = dict.fromkeys(n for spec in KEYS if spec.file == path.name and spec.key in keys for n in spec.notes)
    sidecar = path.with_name(path.stem + ".provenance.json")
    provenance = {
        "schema": schema_stamp("lacuna_files"),
        "written_by": f"lacuna-bench {package_versions()['lacuna-bench']}",
        "lacuna_file": path.name,
        **origin,
        "keys": dict(keys),
        "absent": dict(absent),
        "differences": {n: NOTES[n] for n in used},
        "docs": "docs/release.md, 'Results in LACUNA's key names'",
    }
    return [write_json(path, content), write_json(sidecar, provenance)]


# -- writers -----------------------------------------------------------------------------------------------------


def run_lacuna_files(results: Mapping[str, Any], out: str | Path, *, models: bool = False) -> list[Path]:
    """Write every field x method of a ``results.json`` (``lacuna run``) as LACUNA's files under ``out``, in LACUNA's
    layout: ``unlearned_models/<Field>/<Method>/{Panorama_SUMMARY,extraction_leakage}.json`` and
    ``cached_notebook_files/precision_metrics/<target>/<Field>/<Method>/metrics.json`` (with sidecars), so that
    LACUNA's notebook pointed at ``out`` reads them. ``models``: also place each method's reported checkpoint (its
    entry's ``model``) in ``unlearned_models/<Field>/<Method>/``, where LACUNA's scripts load the unlearned model
    (hard links: no copy of the weights where the file system allows). Returns the written paths."""
    out = Path(out)
    by_field = results.get("by_field") or {results.get("field"): {"methods": results.get("methods") or {}}}
    written: list[Path] = []
    for field, field_out in by_field.items():
        for method, entry in (field_out.get("methods") or {}).items():
            doc = {**entry, _FIELD: field}
            where = {"field": lacuna_field(field), "method": lacuna_method(method)}
            origin = {
                "source": "results.json",
                "entry": f"by_field.{field}.methods.{method}",
                "checkpoint": entry.get("checkpoint"),
            }
            run_dir = out / "unlearned_models" / where["field"] / where["method"]
            if models and entry.get("model"):
                written += place_checkpoint(Path(entry["model"]), run_dir)
            for file, extra in ((PANORAMA, {}), (LEAKAGE, _attack_settings(entry))):
                content, keys, absent = _fill(file, doc, "run")
                written += _write(run_dir / file, content, keys, absent, {**origin, **extra})
            for target in LACUNA_TARGETS:
                content, keys, absent = _fill(PRECISION, doc, "run", target)
                settings = {"target": target, "localization_settings": entry.get("localization_settings")}
                if entry.get("not_applicable"):
                    settings["not_applicable"] = entry["not_applicable"]
                precision_dir = out / "cached_notebook_files" / "precision_metrics" / target
                path = precision_dir / where["field"] / where["method"] / PRECISION
                written += _write(path, content, keys, absent, {**origin, **settings})
    return written


def place_checkpoint(model: Path, dest: Path) -> list[Path]:
    """The files of the HF checkpoint ``model`` (not its ``snapshots/``) in ``dest``, each replaced atomically: a hard
    link where ``dest`` is on the same file system, else a copy. Returns the placed paths."""
    import os
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    placed = []
    for item in sorted(model.iterdir()):
        if not item.is_file():
            continue
        target = dest / item.name
        temporary = dest / f".{item.name}.placing"
        temporary.unlink(missing_ok=True)
        try:
            os.link(item, temporary)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(item, temporary)
        os.replace(temporary, target)
        placed.append(target)
    return placed


def _attack_settings(entry: Mapping[str, Any]) -> dict[str, Any]:
    attack = entry.get("attack") or {}
    return {"attack": {k: attack.get(k) for k in ("protocol", "judge", "attempts", "persons")}}


def score_lacuna_files(
    score: Mapping[str, Any], out: str | Path, *, layout: str = "{target}", source: str = "score.json"
) -> list[Path]:
    """Write a ``score.json`` (``lacuna score``) as LACUNA's precision files ``out/<layout>/metrics.json`` (with
    sidecars) for the targets ``forget`` and ``unified``; ``layout`` holds ``{target}``, e.g.
    ``{target}/Email_Address/SimNPO`` for LACUNA's own ``precision_metrics/`` tree. ``source`` names the score.json
    in the sidecars."""
    out = Path(out)
    manifest = score.get("manifest") or {}
    origin = {
        "source": source,
        "inputs": manifest.get("inputs"),
        "masks": manifest.get("masks"),
        "localization_settings": score.get("localization_settings"),
        "not_applicable": score.get("not_applicable"),
    }
    written: list[Path] = []
    for target in LACUNA_TARGETS:
        content, keys, absent = _fill(PRECISION, score, "score", target)
        path = out / layout.format(target=target) / PRECISION
        written += _write(path, content, keys, absent, {**origin, "target": target})
    return written


def split_layout(path: str | Path) -> tuple[Path, str]:
    """``--lacuna-files`` as (root, layout): a path holding ``{target}`` splits at its first templated part
    (``.../precision_metrics/{target}/F/M`` -> ``.../precision_metrics``, ``{target}/F/M``); any other path is the
    root of ``<target>/metrics.json``."""
    parts = Path(path).parts
    first = next((i for i, part in enumerate(parts) if "{target}" in part), None)
    if first is None:
        return Path(path), "{target}"
    return Path(*parts[:first]) if first else Path("."), str(Path(*parts[first:]))
