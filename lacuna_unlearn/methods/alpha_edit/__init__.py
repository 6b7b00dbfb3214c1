"""AlphaEdit: the null-space constrained closed-form edit (edit.py) and its preserved-knowledge keys (keys.py)."""
