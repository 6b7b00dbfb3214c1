"""The meta-evaluation's pool: one row per unlearned model of a ``lacuna run`` (method × field × seed), with every
candidate predictor and every outcome read from its ``results.json`` entry (docs/meta.md, "The pool").

A model is a method's checkpoint at its chosen stopping point in one field with one unlearning seed; the first
seed's entries are ``by_field.<field>.methods``, the other seeds' ``by_field.<field>.seed_entries.<seed>``. The noise
controls (method-free updates, :data:`NOISE_METHODS`) are rows like any other, flagged ``noise``. Other stopping
points of the first seed's methods and checkpoints listed to ``lacuna meta`` (:mod:`.sources`) join as rows whose
``point`` says which they are; the meta stages measure them as the run measures its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lacuna_unlearn.bench.metric_table import METRIC_TABLE

__all__ = ["HEADLINE_OUTCOME", "NOISE_METHODS", "OUTCOMES", "PREDICTORS", "PoolModel", "pool_models", "run_seeds"]

#: The method-free updates that enter the pool as noise controls (lacuna_unlearn/methods/method_free.py).
NOISE_METHODS = ("null_gaussian", "null_weight_decay")


def _path(entry: Mapping[str, Any], path: str) -> Any:
    node: Any = entry
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _metric(key: str) -> Callable[[Mapping[str, Any]], Any]:
    """A predictor read where METRIC_TABLE says the run's entry holds ``key``."""
    return lambda entry: _path(entry, METRIC_TABLE[key].run_path)


def _lift(target: str) -> Callable[[Mapping[str, Any]], Any]:
    """The calibrated lift over the method-free null of the target's verdict family; 0 where no family passed the
    null calibration (the update is not distinguishable from a method-free one: no lift), None where not scored."""

    def read(entry: Mapping[str, Any]) -> Any:
        auc = _path(entry, f"auc.{target}")
        if not isinstance(auc, Mapping):
            return None
        value = _path(auc, "best_lift.value")
        return 0.0 if value is None else value

    return read


def _source_leak(source: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda entry: _path(entry, f"reversibility.sources.{source}.forget_leak")


def _change(after: Callable[[Mapping[str, Any]], Any], before: str) -> Callable[[Mapping[str, Any]], Any]:
    def read(entry: Mapping[str, Any]) -> Any:
        a, b = after(entry), _path(entry, before)
        return None if a is None or b is None else float(a) - float(b)

    return read


#: Candidate predictors of lasting forgetting: name -> (how it is read from a run entry, what it is). The
#: diagnostics (``mean_pca_distance``, ``cka``, ``fisher_shift``) and ``relative_l2`` are added by the meta stages.
PREDICTORS: dict[str, tuple[Callable[[Mapping[str, Any]], Any], str]] = {
    "auc_forget_calibrated": (_metric("auc_forget_calibrated"), METRIC_TABLE["auc_forget_calibrated"].description),
    "auc_unified_calibrated": (_metric("auc_unified_calibrated"), METRIC_TABLE["auc_unified_calibrated"].description),
    "lift_forget": (_lift("forget"), "calibrated AUC(F) lift over the method-free null (0: no family passed)"),
    "lift_unified": (_lift("unified"), "calibrated AUC(F∪R) lift over the method-free null (0: no family passed)"),
    "frag": (_metric("frag"), METRIC_TABLE["frag"].description),
    "l2": (_metric("l2"), METRIC_TABLE["l2"].description),
    "forget_leak": (_metric("forget_leak"), METRIC_TABLE["forget_leak"].description),
    "j_w": (_metric("j_w"), METRIC_TABLE["j_w"].description),
    "prob": (_metric("prob"), METRIC_TABLE["prob"].description),
    "es": (_metric("es"), METRIC_TABLE["es"].description),
    "em": (_metric("em"), METRIC_TABLE["em"].description),
}

#: Outcomes (higher = the forgetting lasted less): name -> (how it is read, what it is).
OUTCOMES: dict[str, tuple[Callable[[Mapping[str, Any]], Any], str]] = {
    "leak_relearned_retain": (_source_leak("retain"), "forget leak after restricted relearning from retain rows"),
    "leak_relearned_unrelated": (
        _source_leak("unrelated"),
        "forget leak after restricted relearning from unrelated text",
    ),
    "leak_relearned_forget": (_source_leak("forget"), "forget leak after restricted relearning from the forget rows"),
    "success_at_n_relearned": (
        lambda e: _path(e, "attack.success_at_n_relearned"),
        "Success@N of LACUNA's resurfacing attack after its held-out relearning",
    ),
    "delta_leak_retain": (
        _change(_source_leak("retain"), "behaviour.forget_leak"),
        "change of the forget leak under relearning from retain rows",
    ),
    "delta_leak_unrelated": (
        _change(_source_leak("unrelated"), "behaviour.forget_leak"),
        "change of the forget leak under relearning from unrelated text",
    ),
    "delta_success_at_n": (
        _change(lambda e: _path(e, "attack.success_at_n_relearned"), "attack.success_at_n_unlearned"),
        "change of Success@N under the resurfacing attack's relearning",
    ),
}


#: The outcome the plots and the ranking chart are drawn for by default (``meta.headline`` / ``--headline`` choose
#: another; every outcome is in the tables): relearning from retain rows, the benign threat.
HEADLINE_OUTCOME = "leak_relearned_retain"


@dataclass
class PoolModel:
    """One unlearned model of the pool: where it came from, its entry and the values read from it."""

    field: str
    method: str
    seed: int
    entry: Mapping[str, Any]
    noise: bool = False
    predictors: dict[str, float | None] = field(default_factory=dict)
    outcomes: dict[str, float | None] = field(default_factory=dict)
    #: which checkpoint of the method: ``chosen`` (the run's stopping point), ``end``, ``step N``, or ``checkpoint``
    #: (listed to ``lacuna meta``; ``where`` says which)
    point: str = "chosen"
    where: str | None = None

    @property
    def name(self) -> str:
        if self.point == "checkpoint":
            return f"{self.method}/{self.field} checkpoint {self.where}"
        at = "" if self.point == "chosen" else f" at {self.point}"
        return f"{self.method}/{self.field}/seed {self.seed}{at}"

    @property
    def model(self) -> str:
        return str(self.entry.get("model"))

    def read(self) -> None:
        """Fill predictors and outcomes from the entry (extra predictors set by the stages are kept)."""
        for name, (reader, _) in PREDICTORS.items():
            self.predictors[name] = _number(reader(self.entry))
        for name, (reader, _) in OUTCOMES.items():
            self.outcomes[name] = _number(reader(self.entry))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_seeds(results: Mapping[str, Any]) -> list[int]:
    """The unlearning seeds of a run, first seed first (``--seeds``, else its one ``seed``): the first seed's
    entries are ``by_field.<field>.methods``."""
    seeds = [int(s) for s in (_path(results, "manifest.config.seeds") or [])]
    return seeds or [int(_path(results, "manifest.config.seed") or 0)]


def pool_models(results: Mapping[str, Any]) -> list[PoolModel]:
    """Every method × field × seed of a run's results (module docstring), in field, seed, method order."""
    seeds = run_seeds(results)
    pool: list[PoolModel] = []
    for field_name, entry in (results.get("by_field") or {}).items():
        per_seed = {seeds[0]: entry.get("methods") or {}}
        for seed, methods in (entry.get("seed_entries") or {}).items():
            per_seed[int(seed)] = methods
        for seed, methods in per_seed.items():
            for method, m_entry in methods.items():
                model = PoolModel(field_name, method, seed, m_entry, noise=method in NOISE_METHODS)
                model.read()
                pool.append(model)
    return pool
