"""QA rows as the unlearning losses, the methods and the testbed's QA tuning read them: the one encoding (prompt +
answer -> input_ids/labels) and the forget/retain datasets."""
