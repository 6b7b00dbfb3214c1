"""Hydra configs of ``lacuna-unlearn`` (a package so Hydra can find them in an installed wheel)."""
