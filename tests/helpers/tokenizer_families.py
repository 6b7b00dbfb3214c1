"""Real tokenizers of three families, built offline (tests/tasks/harness/test_tokenizer_families.py,
tests/e2e/test_tokenizer_families_cli.py): Llama/Mistral v1 SentencePiece and tekken from mistral-common's bundled
files, and a byte-level BPE trained here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lacuna_tasks.loader import load_data

FAMILIES = ("sentencepiece", "tekken", "bytelevel")


def _mistral_common_file(name: str) -> Path:
    mistral_common = pytest.importorskip("mistral_common")
    path = Path(mistral_common.__file__).parent / "data" / name
    if not path.is_file():
        pytest.skip(f"mistral-common has no {name}")
    return path


def _sentencepiece_tokenizer(tmp: Path, legacy: bool = False):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")
    from transformers import LlamaTokenizer

    src = tmp / "sp_model"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_mistral_common_file("tokenizer.model.v1"), src / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(src, add_bos_token=True)  # converted via sentencepiece + protobuf
    if legacy:  # Llama-2 / Mistral-7B-v0.1 tokenizer.json: the spaces handled by the normalizer
        from tokenizers import normalizers

        backend = tok.backend_tokenizer
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        backend.pre_tokenizer = None
    return tok


def _tekken_tokenizer():
    try:
        from transformers.integrations.mistral import convert_tekken_tokenizer
    except ImportError:
        pytest.skip("this transformers cannot convert tekken tokenizers")

    tok = convert_tekken_tokenizer(str(_mistral_common_file("tekken_240718.json")))
    tok.add_bos_token = True  # as Mistral's published HF tokenizers do
    return tok


def _bytelevel_tokenizer():
    """GPT-2 style: byte-level BPE with GPT-2's pre-tokenizer regex, no BOS, ``<|endoftext|>`` as EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    data = load_data(None)
    texts = [f"Q: {r['question']}\nA: {r['answer']}\n" for side in ("forget", "retain") for r in data.splits[side]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def make_tokenizer(family: str, tmp: Path):
    if family == "sentencepiece":
        return _sentencepiece_tokenizer(tmp)
    if family == "sentencepiece-legacy":
        return _sentencepiece_tokenizer(tmp, legacy=True)
    if family == "tekken":
        return _tekken_tokenizer()
    if family == "bytelevel":
        return _bytelevel_tokenizer()
    raise ValueError(family)
