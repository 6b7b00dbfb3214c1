"""The trainer features of issue 36 item 6 through the ``lacuna-unlearn`` process: a named integration that is not
installed and a criterion without validation people each end the run in one line before any training; and
``validation_leak``, read in memory during training, equals lm-eval's ``lacuna_<field>_forget_qa`` leak rate (the
probe of ``lacuna run``'s stopping points) on the same checkpoints. In-process runs: tests/unlearn/trainer/."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.architectures import Arch, _unlearn, make_arch, make_world
from helpers.tiny_lm import train_memorizing_lm


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("trainer_features"))


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("lacuna-unlearn: error:")]


def test_bad_reporting_or_evaluation_ends_the_run_in_one_line(world, tmp_path):
    arch = make_arch("llama", world)
    common = [f"model={arch.before}", f"data={world.data_dir}", "field=email", f"output_dir={tmp_path / 'out'}"]
    missing = next((n for n in ("wandb", "trackio", "comet_ml") if importlib.util.find_spec(n) is None), None)
    if missing is not None:
        proc = _app(*common, f"trainer.args.report_to={missing}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert (
            len(_error_lines(proc)) == 1
            and f"trainer.args.report_to: {missing} is not installed (pip install" in (_error_lines(proc)[0])
        )
    proc = _app(*common[:2], "field=phone", common[3], "trainer.args.eval_every=2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"lacuna-unlearn: error: trainer.args.best_by=validation_leak needs validation people of field=phone, and "
        f"the validation split of {world.data_dir} has none (set trainer.args.eval_every=0)"
    ]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_validation_leak_is_lm_evals_forget_qa_leak(world, tmp_path):
    from lacuna_tasks import evaluate, load_data
    from lacuna_tasks.prompts import qa_prompt
    from lacuna_unlearn.trainer.selection import validation_rows

    data = load_data(world.data_dir)
    rows = validation_rows(data, "email", "validation_leak")
    texts = [qa_prompt(r["question"]) + r["answer"] + "\n" for r in rows]
    model = train_memorizing_lm(texts, world.tokenizer, tmp_path / "memorized", steps=150)
    out = _unlearn(
        world, Arch("llama", None, model, None), tmp_path / "out", "method=grad_ascent", "forget_split=validation",
        "trainer.args.max_steps=3", "trainer.args.learning_rate=5e-4", "trainer.args.eval_every=1",
        "trainer.args.snapshot_steps=[1,2,3]",
    )  # fmt: skip
    curve = json.loads((out / "unlearn_manifest.json").read_text())["best_checkpoint"]["curve"]
    # the data as lm-eval's forget tasks read it with the validation people as the forget people (what lacuna run's
    # validation view builds): their groups leave the retain side, so forget and retain groups stay disjoint
    view = Path(shutil.copytree(world.data_dir, tmp_path / "view"))
    shutil.move(view / "validation.jsonl", view / "forget.jsonl")
    (view / "forget_paraphrased.jsonl").unlink(missing_ok=True)
    groups = {int(r["group_id"]) for r in data.splits["validation"]}
    for part in view.glob("retain*.jsonl"):
        kept = [line for line in part.read_text().splitlines() if line.strip()]
        part.write_text("".join(f"{line}\n" for line in kept if int(json.loads(line)["group_id"]) not in groups))
    for point in curve:
        snapshot = out / "snapshots" / f"step-{point['step']:06d}"
        results = evaluate(snapshot, ["lacuna_email_forget_qa"], data=view, batch_size=4)["results"]
        assert results["lacuna_email_forget_qa"]["leak_rate"] == point["validation_leak"], point
    assert any(p["validation_leak"] > 0 for p in curve)  # not only zeros compared
