"""Hooks: the product's backend decides before anything is stored (``client``)."""
