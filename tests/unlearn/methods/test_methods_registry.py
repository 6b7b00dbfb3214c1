"""The method registry (``lacuna_unlearn.methods.registry``): one lazy table for trained methods and training-free
editors, the ``Method.prepare`` hook, and the Hydra method configs built from the method dataclasses."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict

import pytest
from helpers import REPO

from lacuna_unlearn.methods.registry import (
    EDITORS,
    METHODS,
    REGISTRY,
    config_class,
    config_defaults,
    lookup,
    make_method,
    resolve,
)

CONFIGS = REPO / "lacuna_unlearn" / "configs"

#: ``asdict`` of the method each ``configs/method/*.yaml`` built before the YAMLs were reduced to overrides of the
#: dataclass defaults (issue 21): (method.name, method.restrict, asdict; editors with the top-level seed 42).
BEFORE = {
    "alpha_edit": ("alpha_edit", "none", {'layers': [4, 5, 6, 7, 8], 'target': "I don't know.", 'module': 'auto', 'block': 'auto', 'v_num_grad_steps': 50, 'v_lr': 0.05, 'v_weight_decay': 1.0, 'clamp_norm_factor': 0.5, 'kl_factor': 1.0, 'l2': 1.0, 'nullspace_threshold': 0.001, 'nullspace_relative': False, 'batch_size': 5, 'fact_token': 'subject_last', 'context_templates': ['{}'], 'kl_prompt': '{} is a', 'cov_text': ['retain', 'neutral'], 'cov_files': [], 'cov_samples': 100000, 'max_length': 256, 'seed': 42}),
    "finetune": ("finetune", "none", {'gamma': 1.0, 'alpha': 1.0}),
    "frp": ("frp", "none", {'rho': 0.03, 'lam': 0.05, 'beta': 0.0, 'shrink': 0.0, 'target': 'mlp', 'calib_samples': 400, 'max_length': 256, 'seed': 42}),
    "ga_kl": ("grad_diff", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'kl'}),
    "grad_ascent": ("grad_ascent", "none", {'gamma': 1.0, 'alpha': 1.0}),
    "grad_diff": ("grad_diff", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'nll'}),
    "idk_dpo": ("idk_dpo", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'nll', 'beta': 0.1, 'refusal': "I don't know.", 'openunlearning_scale': False, 'refusal_ids': ()}),
    "jensun": ("jensun", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'jsd', 'refusal': ' No idea', 'refusal_ids': (), 'legacy_unmasked': False}),
    "memflex": ("memflex", "none", {'gamma': 1.0, 'alpha': 1.0, 'forget_factor': -0.6, 'retain_factor': 2.0, 'cos_threshold': 0.92, 'grad_threshold': 0.0006, 'locate_batch_size': 8, 'random_labels': True, 'seed': 42}),
    "npo": ("npo", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'nll', 'beta': 0.1}),
    "npo_kl": ("npo", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'kl', 'beta': 0.1}),
    "null_gaussian": ("null_gaussian", "none", {'kind': 'gaussian', 'size': 0.01, 'scope': 'all', 'seed': 42}),
    "null_weight_decay": ("null_weight_decay", "none", {'kind': 'weight_decay', 'size': 0.01, 'scope': 'all', 'seed': 42}),
    "oracle_grad": ("grad_diff", "forget_mask", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'nll'}),
    "rlabel": ("rlabel", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'nll', 'seed': 42}),
    "rmu": ("rmu", "none", {'gamma': 1.0, 'alpha': 1.0, 'retain_loss_type': 'embed_diff', 'layer': -1, 'steering_coeff': 2.0, 'seed': 42}),
    "selective_pruning": ("selective_pruning", "none", {'frac': 0.05, 'eps': 1e-05, 'scope': 'global', 'mode': 'neuron', 'calib_samples': 400, 'max_length': 256, 'seed': 42}),
    "simnpo": ("simnpo", "none", {'gamma': 0.125, 'alpha': 1.0, 'retain_loss_type': 'nll', 'beta': 4.5, 'delta': 0.0}),
    "undial": ("undial", "none", {'gamma': 1.0, 'alpha': 0.0, 'retain_loss_type': 'nll', 'beta': 10.0, 'masked': True}),
    "wagle": ("wagle", "none", {'gamma': 1.0, 'alpha': 1.0, 'objective': 'grad_diff', 'beta': 0.1, 'retain_loss_type': 'nll', 'ratio': 0.8, 'mu': 1e-06, 'target': 'linear', 'scope': 'global', 'batch_size': 8}),
}  # fmt: skip


#: The editors' config classes (settings + the run's seed), as their ``run_from_config`` builds them.
EDITOR_CONFIGS = {
    "frp": "lacuna_unlearn.methods.frp:FRPConfig",
    "alpha_edit": "lacuna_unlearn.methods.alpha_edit.edit:AlphaEditConfig",
    "selective_pruning": "lacuna_unlearn.methods.selective_pruning:SPConfig",
    "null_gaussian": "lacuna_unlearn.methods.method_free:MethodFreeConfig",
    "null_weight_decay": "lacuna_unlearn.methods.method_free:MethodFreeConfig",
}


def _typed(values: dict) -> dict:
    """Values with their types: 1 and 1.0, () and [] differ."""
    return {k: (type(v).__name__, v) for k, v in values.items()}


def test_importing_the_registry_and_composing_imports_no_method_module():
    """The registry, the Hydra method configs and a composed config: no torch, no method module (a bad override of
    ``lacuna-unlearn`` fails in about a second)."""
    code = (
        "import sys; import lacuna_unlearn.methods, lacuna_unlearn.trainer.app; "
        "from lacuna_unlearn.methods.registry import REGISTRY, lookup, config_defaults; lookup('simnpo'); "
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module(config_module='lacuna_unlearn.configs', version_base='1.3'):\n"
        "    cfg = compose(config_name='unlearn', overrides=['method=alpha_edit', 'output_dir=o'])\n"
        "assert cfg.method.args.layers == [4, 5, 6, 7, 8]\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('lacuna_unlearn.methods.') "
        "and m not in ('lacuna_unlearn.methods.registry', 'lacuna_unlearn.methods.settings')]; print(bad); "
        "assert not bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_views_and_lookup_errors():
    assert {"grad_diff", "simnpo", "wagle", "finetune"} <= set(METHODS) and set(EDITORS) == {
        "frp", "alpha_edit", "selective_pruning", "null_gaussian", "null_weight_decay",
    }  # fmt: skip
    assert not set(METHODS) & set(EDITORS) and set(METHODS) | set(EDITORS) == set(REGISTRY)
    from lacuna_unlearn.methods.simnpo import SimNPO

    assert METHODS["simnpo"] is SimNPO and "frp" not in METHODS and "simnpo" not in EDITORS
    assert EDITORS["frp"] is resolve("frp", "editor") and callable(EDITORS["frp"])
    with pytest.raises(ValueError, match=r"unknown method 'nope'; available: \[.*'simnpo'"):
        lookup("nope")
    with pytest.raises(ValueError, match="unknown method 'frp'"):
        make_method("frp")  # an editor is not a trained method
    with pytest.raises(ValueError, match="unknown training-free method 'simnpo'"):
        resolve("simnpo", "editor")
    with pytest.raises(ValueError, match="method 'npo'.*temperature"):
        make_method("npo", temperature=2)


def test_every_entry_resolves_and_its_defaults_build_it():
    for name, entry in REGISTRY.items():
        assert callable(resolve(name))
        defaults = config_defaults(name)
        assert "refusal_ids" not in defaults  # filled by prepare(tokenizer), not a setting
        if entry.kind == "editor":
            assert "seed" not in defaults  # the run's top-level seed, which method.args must not shadow
        else:
            method = make_method(name, **defaults)
            assert asdict(method) == asdict(make_method(name)) and isinstance(method, config_class(name))
            # every field but the run-time ones is a setting: the defaults have one home
            assert set(asdict(method)) - set(defaults) <= {"refusal_ids"}


def test_method_interface_has_prepare_and_no_alternate_by_default():
    method = make_method("grad_diff")
    assert method.prepare(object()) is None and method.alternate_answer_ids() is None
    from pathlib import Path

    import lacuna_unlearn.trainer.loop as loop

    source = Path(loop.__file__).read_text()
    assert 'getattr(method, "prepare"' not in source and "method.prepare(tokenizer)" in source


@pytest.mark.parametrize("file", sorted(p.stem for p in (CONFIGS / "method").glob("*.yaml")))
def test_method_yaml_builds_the_same_method_as_before(file):
    """``lacuna-unlearn method=X``: the YAML only names the method and its overrides, the dataclass holds the
    defaults, and the method built from the composed config is the one the full YAMLs built."""
    import importlib

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=[f"method={file}", "output_dir=o"])
    name, restrict, expected = BEFORE[file]
    args = OmegaConf.to_container(cfg.method.args, resolve=True)
    if lookup(cfg.method.name).kind == "editor":
        module, cls = EDITOR_CONFIGS[cfg.method.name].split(":")
        built = asdict(getattr(importlib.import_module(module), cls)(**{"seed": int(cfg.seed), **args}))
    else:
        built = asdict(make_method(cfg.method.name, **args))
    assert (cfg.method.name, cfg.method.restrict) == (name, restrict)
    assert _typed(built) == _typed(expected)
    text = (CONFIGS / "method" / f"{file}.yaml").read_text()
    assert "/method_defaults@" in text  # extends the registered dataclass defaults, no copy of them
