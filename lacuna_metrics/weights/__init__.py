"""Reading weights: checkpoints one block at a time, the ordered walk over a pair, the model's anatomy, threads."""
