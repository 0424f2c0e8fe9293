"""Replicated data-parallel training (DDP's kind): the strategy (`strategy`), the state each rank holds whole
(`replica`), bucketed gradient sums (`reduction`), its transfer from peers (`sync`) and the script's snapshots
(`snapshot`)."""
