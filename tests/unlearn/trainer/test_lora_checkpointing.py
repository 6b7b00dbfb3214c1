"""LoRA under gradient checkpointing trains (issue 36 item 6; OpenUnlearning #178 reports adapters that silently
train nothing there): on two architectures and both checkpointing implementations, checkpointing is engaged, every
LoRA B matrix leaves its zero initialisation, and the merged saved model differs from the input in the adapted
weights only."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.architectures import _unlearn, make_arch, make_world
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("lora_checkpointing"))


@pytest.mark.parametrize("reentrant", ["false", "true"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])  # separate projections; GPT-2's fused Conv1D attention
def test_lora_b_matrices_move_with_gradient_checkpointing(world, name, reentrant):
    arch = make_arch(name, world)
    out = _unlearn(
        world, arch, world.root / name / f"lora_gc_reentrant_{reentrant}", "method=grad_ascent", "lora.enabled=true",
        "lora.r=2", "trainer.args.max_steps=2", "trainer.args.gradient_checkpointing=true",
        f"+trainer.args.gradient_checkpointing_kwargs={{use_reentrant:{reentrant}}}",
    )  # fmt: skip
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["activation_checkpointing"] is True  # the layers ran checkpointed: the test is not vacuous
    adapters = manifest["lora_adapters"]
    assert adapters["b_matrices"] > 0 and adapters["b_moved"] == adapters["b_matrices"], adapters
    before, after = load_file(str(arch.before / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before)  # merged: no adapter tensors left
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith(".weight") and (".h." in n or ".layers." in n) for n in changed), changed
    assert not any("embed" in n or "wte" in n or "norm" in n or "ln_" in n for n in changed), changed
