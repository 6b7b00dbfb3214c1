"""FRAG and its inputs: alignment, targets, activation statistics and their cache, calibration texts, distances."""
