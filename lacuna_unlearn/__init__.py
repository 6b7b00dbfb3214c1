"""Training side of lacuna-bench: testbed builder, unlearning methods, relearning attacks, CLI."""
