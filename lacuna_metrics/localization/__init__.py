"""Localization precision: scoring families, the universe, streaming AUC, null calibration and the leak audit."""
