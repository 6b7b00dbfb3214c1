"""The lm-evaluation-harness side: task hooks, task kinds (memorization, utility, perplexity), results reader, the Python API."""
