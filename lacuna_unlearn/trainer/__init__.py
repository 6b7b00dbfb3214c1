"""The unlearning trainer: the Hydra app, the loop on HF Trainer, QA data and encoding, restriction, LoRA, relearning rows."""
