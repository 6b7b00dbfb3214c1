"""The stage cache keys on content and verifies what it reuses (issue 37 item 2): an edited input or a corrupted
cached output reruns exactly the affected stage; the fingerprint cache keyed by stat stays correct."""

from __future__ import annotations

import json
import os

import pytest

from lacuna_metrics import file_digest, tree_fingerprint
from lacuna_unlearn.bench.stages import Stages, output_key
from lacuna_unlearn.bench.stages import testbed_fingerprint as fingerprint_of_testbed


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LACUNA_CACHE", str(tmp_path / "cache"))


def _stages(tmp_path):
    calls = []

    def build(tag):
        def run(out):
            calls.append(tag)
            (out / "model").mkdir()
            (out / "model" / "weights.bin").write_bytes(b"w" * 100)

        return run

    return Stages(tmp_path / "stages", log=lambda _: None), calls, build


def test_a_cached_stage_is_reused_only_while_its_outputs_are_unchanged(tmp_path):
    stages, calls, build = _stages(tmp_path)
    first = stages.get("unlearn", "u", {"x": 1}, build("a"))
    assert stages.get("unlearn", "u", {"x": 1}, build("b")) == first and calls == ["a"]
    key = output_key(first)
    weights = first / "model" / "weights.bin"
    weights.write_bytes(b"w" * 99 + b"X")  # corrupted in place, same size
    assert stages.get("unlearn", "u", {"x": 1}, build("c")) == first and calls == ["a", "c"]
    assert weights.read_bytes() == b"w" * 100 and output_key(first) == key
    (first / "model" / "extra.txt").write_text("left by hand")  # a file added to a cached stage
    stages.get("unlearn", "u", {"x": 1}, build("d"))
    assert calls == ["a", "c", "d"]


def test_a_stage_recorded_without_a_fingerprint_is_rerun(tmp_path):
    stages, calls, build = _stages(tmp_path)
    first = stages.get("eval", "e", {"y": 2}, build("a"))
    record = json.loads((first / "stage.json").read_text())
    del record["outputs"]  # a stage written by an older lacuna-bench
    (first / "stage.json").write_text(json.dumps(record))
    stages.get("eval", "e", {"y": 2}, build("b"))
    assert calls == ["a", "b"]


def test_the_testbed_key_follows_every_file_of_the_testbed(tmp_path):
    testbed = tmp_path / "testbed"
    (testbed / "data").mkdir(parents=True)
    (testbed / "model").mkdir()
    (testbed / "manifest.json").write_text("{}")
    (testbed / "data" / "forget.jsonl").write_text('{"ID": "1"}\n')
    (testbed / "model" / "model.safetensors").write_bytes(b"\0" * 64)
    key = fingerprint_of_testbed(testbed)
    assert fingerprint_of_testbed(testbed) == key
    (testbed / "data" / "forget.jsonl").write_text('{"ID": "2"}\n')  # data edited in place, manifest untouched
    edited = fingerprint_of_testbed(testbed)
    assert edited != key
    (testbed / "model" / "model.safetensors").write_bytes(b"\1" * 64)
    assert fingerprint_of_testbed(testbed) not in (key, edited)
    (testbed / ".model.lock").write_text("123 lacuna-unlearn")  # a writer's lock file is no content
    assert fingerprint_of_testbed(testbed) == fingerprint_of_testbed(testbed)


def test_the_digest_cache_sees_a_rewrite_even_at_the_same_size(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 10)
    first = file_digest(path)
    assert file_digest(path) == first  # from the cache
    path.write_bytes(b"b" * 10)
    assert file_digest(path) != first
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same stat: the cache answers, and it is right
    assert file_digest(path) == "sha256:" + __import__("hashlib").sha256(b"b" * 10).hexdigest()


def test_tree_fingerprint_ignores_order_and_mtime_but_not_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, names in ((a, ["x", "y"]), (b, ["y", "x"])):
        root.mkdir()
        for n in names:
            (root / n).write_text(n)
    assert tree_fingerprint(a) == tree_fingerprint(b)
    (b / "x").rename(b / "z")
    assert tree_fingerprint(a) != tree_fingerprint(b)
