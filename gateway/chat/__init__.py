"""1:1 chat: a send from its dedup claim and mid to the stores (the claims and
the id source are shared with group sends)."""
