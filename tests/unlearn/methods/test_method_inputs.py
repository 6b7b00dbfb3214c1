"""No unlearning method trains on, or preserves, the testbed's held-out neutral slice.

The neutral-perplexity probe (``lacuna_neutral_ppl``) scores ``data/neutral_heldout.jsonl`` to see whether a method
damaged text it never saw; a method whose inputs hold those documents has its ratio partly guaranteed. Every method
config of ``lacuna_unlearn/configs/method`` runs through the Hydra entry point's input resolution on a testbed
written without training (corpus, splits, held-out slice, manifest), with the last step before any model is loaded
replaced by a recorder of its arguments."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from lacuna_unlearn.methods.registry import EDITORS, store_method_configs

METHOD_CONFIGS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[3] / "lacuna_unlearn/configs/method").glob("*.yaml")
)
#: the function each editor hands its texts to once it has resolved them (it loads the model next)
EDITOR_WORKERS = {
    "alpha_edit": ("lacuna_unlearn.methods.alpha_edit.edit", "run_alpha_edit"),
    "frp": ("lacuna_unlearn.methods.frp", "run_frp"),
    "selective_pruning": ("lacuna_unlearn.methods.selective_pruning", "run_selective_pruning"),
    # the noise controls read no text at all (the recorder sees the model and output paths and the settings)
    "null_gaussian": ("lacuna_unlearn.methods.method_free", "run_method_free"),
    "null_weight_decay": ("lacuna_unlearn.methods.method_free", "run_method_free"),
}


class _Recorded(Exception):
    """Raised by a recorder once it has the inputs: nothing after it may run (no model exists)."""


def _strings(value: Any) -> list[str]:
    """Every string inside ``value`` (rows, texts, edit requests, nested containers)."""
    if isinstance(value, str):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _strings(dataclasses.asdict(value))
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple, set)):
        return [s for v in value for s in _strings(v)]
    return []


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> tuple[Path, list[str]]:
    """A smoke-sized testbed directory without weights: the manifest's config, the splits of its corpus and the
    held-out neutral slice, as ``lacuna build-testbed`` writes them."""
    from lacuna_tasks import build_splits, write_dataset
    from lacuna_tasks.schema import NEUTRAL_HELDOUT_FILE
    from lacuna_unlearn.testbed.build import write_neutral_heldout
    from lacuna_unlearn.testbed.corpus import testbed_corpus
    from lacuna_unlearn.testbed.presets import get_preset

    cfg = get_preset("smoke")
    root = tmp_path_factory.mktemp("testbed")
    corpus, heldout = testbed_corpus(cfg)
    splits = build_splits(corpus.profiles, seed=cfg.seed, people_per_field=2, validation_people=1)
    write_dataset(root / "data", corpus.profiles, splits)
    write_neutral_heldout(root / "data" / NEUTRAL_HELDOUT_FILE, heldout)
    manifest = {
        "kind": "lacuna-bench-testbed",
        "config": cfg.to_dict(),
        "neutral_heldout": "data/" + NEUTRAL_HELDOUT_FILE,
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "model").mkdir()
    assert heldout, "the smoke preset holds out neutral documents"
    return root, heldout


def test_every_editor_has_a_recorder() -> None:
    assert set(EDITOR_WORKERS) == set(EDITORS)  # a new editor must say where its texts can be read


@pytest.mark.parametrize("config", METHOD_CONFIGS)
def test_no_method_input_is_a_held_out_neutral_document(config, testbed, tmp_path, monkeypatch) -> None:
    from hydra import compose, initialize_config_module

    import lacuna_metrics
    from lacuna_unlearn.trainer import app, loop

    root, heldout = testbed
    seen: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> None:
        seen.extend([args, kwargs])
        raise _Recorded

    monkeypatch.setattr(loop, "unlearn", record)
    monkeypatch.setattr(lacuna_metrics, "load_masks", lambda path: None)  # oracle_grad's masks: not read here
    for module, name in EDITOR_WORKERS.values():
        monkeypatch.setattr(importlib.import_module(module), name, record)
    store_method_configs()
    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=[f"method={config}", f"testbed={root}", "field=email",
                                                        f"output_dir={tmp_path / 'out'}"])  # fmt: skip
    with pytest.raises(_Recorded):
        app._run(cfg)
    texts = _strings(seen)
    assert texts, f"{config}: no input recorded"
    for doc in heldout:
        overlapping = [t for t in texts if doc in t]
        assert not overlapping, f"method={config} reads a held-out neutral document: {overlapping[0][:80]!r}"


def test_alpha_edit_preserves_the_trained_neutral_text_only(testbed) -> None:
    """The preserved keys still read the neutral documents the testbed trained on: only the held-out slice is
    left out, and the manifest's sources count it."""
    from lacuna_tasks import load_data
    from lacuna_unlearn.methods.alpha_edit.keys import preserved_texts
    from lacuna_unlearn.methods.settings import AlphaEditSettings
    from lacuna_unlearn.testbed.corpus import testbed_corpus
    from lacuna_unlearn.testbed.presets import get_preset

    root, heldout = testbed
    texts, sources = preserved_texts(AlphaEditSettings(cov_text=["neutral"]), load_data(root))
    trained = testbed_corpus(get_preset("smoke"))[0].neutral
    assert texts == list(trained) and sources["neutral"] == len(trained)
    assert not set(texts) & set(heldout)
    # a cov_files line that is a held-out document is left out too, and counted
    extra = root / "extra.txt"
    extra.write_text(heldout[0] + "\nsome other text\n")
    texts, sources = preserved_texts(AlphaEditSettings(cov_text=[], cov_files=[str(extra)]), load_data(root))
    assert texts == ["some other text"] and sources["neutral_heldout_excluded"] == 1
