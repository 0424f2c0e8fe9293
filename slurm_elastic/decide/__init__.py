"""Pure decisions: each takes a snapshot (and the time) and returns a decision with its reason."""
