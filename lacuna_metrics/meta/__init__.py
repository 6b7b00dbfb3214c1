"""Meta-evaluation: which measurement predicts that forgetting lasts, tested against the testbed's ground truth
(docs/meta.md). Statistics over a pool of unlearned models."""
