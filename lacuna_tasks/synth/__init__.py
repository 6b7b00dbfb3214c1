"""The synthetic generator: PANORAMA-style profiles, bios, splits and dataset directories."""
