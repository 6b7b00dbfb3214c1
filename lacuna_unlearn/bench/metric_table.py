"""One home for the metric keys of a Lacuna result: what each means and where ``results.json``, ``score.json`` and
lm-eval results hold it.

``lacuna run`` (the writer of ``results.json``), ``lacuna gate`` and the run report derive their tables from
:data:`METRIC_TABLE`, so a metric is declared once. The task suffixes are those of the per-field lm-eval tasks
``lacuna_<field>_<suffix>`` (docs/tasks.md). Schema names and versions are :mod:`lacuna_metrics.schemas`; lm-eval
results files are read by :mod:`lacuna_tasks.harness.results`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BEHAVIOUR_METRICS",
    "METRIC_TABLE",
    "MetricSpec",
    "lm_eval_metrics",
    "run_metric_paths",
    "score_metric_paths",
]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what it means and where each kind of result holds it.

    ``task``/``lm_eval_metric``: the lm-eval task suffix (``lacuna_<field>_<task>``) and metric name, or None
    when no lm-eval task computes it. ``run_path``: dotted path inside a ``results.json`` method entry
    (``methods.<name>``). ``score_path``: dotted path inside a ``score.json``, or None.
    """

    description: str
    run_path: str
    task: str | None = None
    lm_eval_metric: str | None = None
    score_path: str | None = None


#: Every metric key a user may name (``lacuna gate --check KEY<=X``), in report order.
METRIC_TABLE: dict[str, MetricSpec] = {
    "forget_leak": MetricSpec(
        "forget QA leak rate (lower is better)", "behaviour.forget_leak", "forget_qa", "leak_rate"
    ),
    "retain_accuracy": MetricSpec("retain QA accuracy", "behaviour.retain_accuracy", "retain_qa", "accuracy"),
    "j_w": MetricSpec(
        "worst-case leak J_W over paraphrase, ICR and QA probes", "behaviour.j_w", "forget_worstcase", "j_w"
    ),
    "j_p": MetricSpec("worst-case leak over paraphrases J_P", "behaviour.j_p", "forget_worstcase", "j_p"),
    "j_icr": MetricSpec(
        "worst-case leak over in-context retrieval J_ICR", "behaviour.j_icr", "forget_worstcase", "j_icr"
    ),
    "retain_j_avg": MetricSpec(
        "retain accuracy averaged over paraphrase probes", "behaviour.retain_j_avg", "retain_paraphrase", "j_avg"
    ),
    "retain_eval_accuracy": MetricSpec(
        "held-out retain accuracy (people no unlearning loss saw)",
        "behaviour.retain_eval_accuracy",
        "retain_eval_qa",
        "accuracy",
    ),
    "crossfield_accuracy": MetricSpec(
        "cross-field retention (the forget people's other fields)",
        "behaviour.crossfield_accuracy",
        "crossfield_qa",
        "accuracy",
    ),
    "retain_eval_crossfield_accuracy": MetricSpec(
        "cross-field retention of the held-out retain people",
        "behaviour.retain_eval_crossfield_accuracy",
        "retain_eval_crossfield_qa",
        "accuracy",
    ),
    "em": MetricSpec("exact-match memorization", "behaviour.em", "forget_memorization", "em"),
    "es": MetricSpec("extraction strength", "behaviour.es", "forget_memorization", "es"),
    "prob": MetricSpec("answer probability", "behaviour.prob", "forget_memorization", "prob"),
    # the twins LACUNA's Panorama evaluation reports too (docs/release.md): retain rows (in the field's task group),
    # and both sides' paraphrased rows (tasks *_paraphrased_memorization, run when eval.tasks names them)
    "retain_em": MetricSpec(
        "exact-match memorization, retain rows", "behaviour.retain_em", "retain_memorization", "em"
    ),
    "retain_es": MetricSpec("extraction strength, retain rows", "behaviour.retain_es", "retain_memorization", "es"),
    "retain_prob": MetricSpec(
        "answer probability, retain rows", "behaviour.retain_prob", "retain_memorization", "prob"
    ),
    "forget_paraphrased_em": MetricSpec(
        "exact-match memorization, paraphrased forget rows",
        "behaviour.forget_paraphrased_em",
        "forget_paraphrased_memorization",
        "em",
    ),
    "forget_paraphrased_es": MetricSpec(
        "extraction strength, paraphrased forget rows",
        "behaviour.forget_paraphrased_es",
        "forget_paraphrased_memorization",
        "es",
    ),
    "forget_paraphrased_prob": MetricSpec(
        "answer probability, paraphrased forget rows",
        "behaviour.forget_paraphrased_prob",
        "forget_paraphrased_memorization",
        "prob",
    ),
    "retain_paraphrased_em": MetricSpec(
        "exact-match memorization, paraphrased retain rows",
        "behaviour.retain_paraphrased_em",
        "retain_paraphrased_memorization",
        "em",
    ),
    "retain_paraphrased_es": MetricSpec(
        "extraction strength, paraphrased retain rows",
        "behaviour.retain_paraphrased_es",
        "retain_paraphrased_memorization",
        "es",
    ),
    "retain_paraphrased_prob": MetricSpec(
        "answer probability, paraphrased retain rows",
        "behaviour.retain_paraphrased_prob",
        "retain_paraphrased_memorization",
        "prob",
    ),
    "neutral_ppl_ratio": MetricSpec(
        "neutral-text word perplexity after / before unlearning (held-out prose)", "behaviour.neutral_ppl_ratio"
    ),
    "success_at_n": MetricSpec(
        "Success@N of the extraction probe (after the relearning attack for lacuna run)",
        "attack.success_at_n_relearned",
        "extraction",
        "success_at_n",
    ),
    "success_at_n_unlearned": MetricSpec(
        "Success@N before the relearning attack (lacuna run)", "attack.success_at_n_unlearned"
    ),
    "auc_forget": MetricSpec("best localization AUC(F)", "auc.forget.best.value", score_path="auc.forget.best.value"),
    "auc_unified": MetricSpec(
        "best unified localization AUC", "auc.unified.best.value", score_path="auc.unified.best.value"
    ),
    "auc_forget_vs_retain": MetricSpec(
        "best forget-vs-retain localization AUC",
        "auc.forget_vs_retain.best.value",
        score_path="auc.forget_vs_retain.best.value",
    ),
    "auc_forget_calibrated": MetricSpec(
        "best localization AUC(F) over the null-calibrated families",
        "auc.forget.calibrated_best.value",
        score_path="null_calibration.targets.forget.best.value",
    ),
    "auc_unified_calibrated": MetricSpec(
        "best unified localization AUC over the null-calibrated families",
        "auc.unified.calibrated_best.value",
        score_path="null_calibration.targets.unified.best.value",
    ),
    "auc_forget_lift": MetricSpec(
        "AUC(F) minus null AUC of the calibrated best's family (lift)",
        "auc.forget.best_lift.value",
        score_path="null_calibration.targets.forget.best_lift.value",
    ),
    "frag": MetricSpec("FRAG (forget/retain alignment of the update)", "frag", score_path="frag.frag"),
    "l2": MetricSpec("global L2 norm of the weight update", "l2", score_path="distance.l2"),
}

#: Behaviour metric -> (task suffix, lm-eval metric) of ``lacuna_<field>_<suffix>``: what ``lacuna run`` reads
#: from its lm-eval evaluations into ``methods.<name>.behaviour``.
BEHAVIOUR_METRICS: dict[str, tuple[str, str]] = {
    key: (spec.task, spec.lm_eval_metric)
    for key, spec in METRIC_TABLE.items()
    if spec.run_path.startswith("behaviour.") and spec.task is not None and spec.lm_eval_metric is not None
}


def lm_eval_metrics() -> tuple[tuple[str, str, str], ...]:
    """(task suffix, lm-eval metric, metric key) of every metric an lm-eval results file can hold."""
    return tuple(
        (spec.task, spec.lm_eval_metric, key)
        for key, spec in METRIC_TABLE.items()
        if spec.task is not None and spec.lm_eval_metric is not None
    )


def run_metric_paths() -> dict[str, str]:
    """Metric key -> dotted path inside a ``results.json`` method entry."""
    return {key: spec.run_path for key, spec in METRIC_TABLE.items()}


def score_metric_paths() -> dict[str, str]:
    """Metric key -> dotted path inside a ``score.json`` (only metrics a score.json holds)."""
    return {key: spec.score_path for key, spec in METRIC_TABLE.items() if spec.score_path is not None}
