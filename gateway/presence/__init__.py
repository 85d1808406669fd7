"""Presence: who is online (leases, grace, events) and who watches whom."""
