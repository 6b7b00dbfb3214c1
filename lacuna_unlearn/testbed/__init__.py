"""The testbed builder: corpus, masked injection, QA tuning, presets, memorization probes, tokenizer."""
