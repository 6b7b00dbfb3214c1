"""Train a byte-level BPE tokenizer locally (no hub downloads), for the mini testbed and tests.

Digits are split individually, which makes phone and licence numbers easy to memorize. The
ByteLevel pre-tokenizer must run with ``add_prefix_space=False``: combined with the Digits
pre-tokenizer, ``True`` puts a space before every digit and silently breaks digit fields
(``docs/definitions.md#mini-testbed-notes``).
"""

from __future__ import annotations

from collections.abc import Iterable

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A ``PreTrainedTokenizerFast`` trained on ``texts`` (EOS and PAD special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
