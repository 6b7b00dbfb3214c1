"""The tiny release of tests/helpers/release.py against the published layout (issue 36): file and folder names (the
misspelt ``intruction_tuned/`` included), the dataset card, the parquet files' columns and Arrow types, ``mask.pt``.
Built here with a tiny random model (seconds); the ``tiny_release`` fixture is the same writer on the session's
memorizing model. The layout's source: McGill-NLP/LACUNA ``scripts/download_artifacts.py``, ``configs/paths/eval.yaml``
and ``src/create_memorized_datasets.py`` at commit 93800b0 (docs/tasks.md, "LACUNA's released data")."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from helpers.release import REGIMES, SIZE, write_release

from lacuna_tasks.loader import load_data
from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

FIELD_CONFIGS = {"Email_Address": "Email Address", "Phone_Number": "Phone Number", "Birth_City": "Birth City",
                 "Drivers_License": "Driver's License"}  # fmt: skip
SPLITS = ("forget", "retain", "forget_paraphrased", "retain_paraphrased", "full")
EXPECTED_FILES = {
    *(f"{c}_{s}.parquet" for c in FIELD_CONFIGS for s in SPLITS),
    *(f"validation_{c}_{s}.parquet" for c in ("Email_Address", "Drivers_License") for s in SPLITS),
    "relearn_train.parquet",
}
SCHEMA = pa.schema([("ID", pa.string()), ("question", pa.string()), ("answer", pa.string()),
                    ("field", pa.string()), ("group_id", pa.int32())])  # fmt: skip


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_release_layout")
    profiles = generate_profiles(48, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=8, validation_people=4)
    data_dir = write_dataset(root / "source", profiles, splits)
    return write_release(root / "artifacts", data_dir=data_dir)


def test_the_tree(release):
    size = release.root / SIZE
    assert sorted(p.name for p in size.iterdir()) == ["data-masked", "data-unmasked", "masked", "unmasked"]
    for regime in REGIMES:
        model = size / regime
        for folder in (model, model / "intruction_tuned"):
            names = {p.name for p in folder.iterdir()}
            assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names, folder
        assert not (model / "instruction_tuned").exists()  # the release's spelling, as published
        assert (model / "mask.pt").is_file() == (regime == "masked")
        data = size / f"data-{regime}"
        assert sorted(p.name for p in data.iterdir()) == ["README.md", "data"]
        assert {p.name for p in (data / "data").iterdir()} == EXPECTED_FILES
    assert (release.model("masked"), release.tuned("unmasked"), release.data("masked")) == (
        size / "masked",
        size / "unmasked" / "intruction_tuned",
        size / "data-masked",
    )


def test_the_card(release):
    text = (release.data() / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert list(meta) == ["configs"]
    by_config = {c["config_name"]: c["data_files"] for c in meta["configs"]}
    assert set(by_config) == {*FIELD_CONFIGS, "validation_Email_Address", "validation_Drivers_License", "relearn"}
    for config, files in by_config.items():
        assert all(set(f) == {"split", "path"} for f in files)
        assert {f["path"] for f in files} == {f"data/{config}_{f['split']}.parquet" for f in files}
        assert {f["split"] for f in files} == ({"train"} if config == "relearn" else set(SPLITS))
    assert [c["config_name"] for c in meta["configs"]] == sorted(by_config)  # sorted file names, as the script does


def test_the_authors_reader_reads_it(release, tmp_path):
    """``datasets.load_dataset(dir, name=<Config>, split=<split>)``, as LACUNA's UnlearningData does."""
    import datasets

    for config, split in (("Email_Address", "forget"), ("validation_Drivers_License", "retain"), ("relearn", "train")):
        ds = datasets.load_dataset(str(release.data()), name=config, split=split, cache_dir=str(tmp_path / "hf"))
        assert ds.to_list() == release.tables[f"{config}_{split}"]
        assert ds.features["group_id"].dtype == "int32" and ds.features["ID"].dtype == "string"


@pytest.mark.parametrize("regime", REGIMES)
def test_every_file_is_typed_and_valued_as_published(release, regime):
    for path in sorted((release.data(regime) / "data").iterdir()):
        table = pq.read_table(path)
        assert table.schema.remove_metadata() == SCHEMA, path.name
        assert table.num_rows > 0, path.name
        rows = table.to_pylist()
        config = re.fullmatch(r"(?:validation_)?(\w+?)_(?:forget|retain|full|train)\w*\.parquet", path.name).group(1)
        if config in FIELD_CONFIGS:
            assert {r["field"] for r in rows} == {FIELD_CONFIGS[config]}, path.name
        else:
            assert {r["field"] for r in rows} <= set(FIELD_CONFIGS.values())
        assert not any(r["question"].startswith("Q:") or "\nA:" in r["question"] for r in rows)  # the raw prompt


def test_people_differ_per_field_and_the_data_loads(release):
    data = load_data(release.data())
    (person,) = release.absent["Phone Number"]
    assert person in {r["ID"] for r in data.rows("forget", "email")}
    assert person not in {r["ID"] for table in release.tables if table.startswith("Phone_Number")
                          for r in release.tables[table]}  # fmt: skip
    assert load_data(release.data("unmasked")).splits == data.splits


def test_mask_pt(release):
    """dict parameter name -> flat int32 tensor, bit g = group g; every parameter listed; skipped tensors zero."""
    from transformers import AutoModelForCausalLM

    from lacuna_metrics.masks import load_masks, named_shapes_of

    masks = torch.load(release.mask, map_location="cpu", weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(release.model())
    shapes = named_shapes_of(model)
    assert list(masks) == list(shapes)
    last = model.config.num_hidden_layers - 1
    for name, packed in masks.items():
        assert packed.dtype == torch.int32 and packed.dim() == 1 and packed.numel() == torch.Size(shapes[name]).numel()
        assert int(packed.min()) >= 0 and int(packed.max()) < 1 << 6  # six groups
        assert bool(((packed & (packed - 1)) == 0).all())  # at most one group per scalar
        skipped = "embed_tokens" in name or "norm" in name or f"layers.{last}." in name
        assert bool((packed == 0).all()) == skipped, name
    mask_set = load_masks(release.mask).reshape_to(shapes)
    assert all(c > 0 for c in mask_set.total_counts())


def test_the_model_to_unlearn_differs_in_the_unmasked_blocks_only(release):
    """Instruction tuning is a LoRA on the blocks the masks leave out, merged: ``intruction_tuned`` is W_cpt there."""
    from safetensors.torch import load_file

    cpt = load_file(release.model() / "model.safetensors")
    tuned = load_file(release.tuned() / "model.safetensors")
    assert cpt.keys() == tuned.keys()
    changed = {name for name in cpt if not torch.equal(cpt[name], tuned[name])}
    assert changed and all(".layers.1." in name for name in changed), changed
    unmasked = load_file(release.model("unmasked") / "model.safetensors")
    assert any(not torch.equal(cpt[n], unmasked[n]) for n in cpt if ".layers.0." in n)  # another training run
