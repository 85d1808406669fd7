"""1:1 chat: sends (dedup claims, mids, stores), conversations and unread,
and the message operations (read, recall, typing, presence watches)."""
