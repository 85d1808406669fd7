"""Contacts, privacy settings and blocks: who may reach whom."""
