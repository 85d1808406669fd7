"""The inbox: what a user has across 1:1 chat and groups - conversations with
unread counts, read marks and receipts, recall, typing, presence watches."""
