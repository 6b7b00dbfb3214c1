"""``lacuna gate``: subjects, criteria, checkpoint identity and output."""
