"""The unlearning trainer: the Hydra app, the loop on HF Trainer, restriction and the relearning rows."""
