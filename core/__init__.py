"""Pure logic shared by every package: ids, cursors, group commit, rate limits,
and the decision cores of chat, groups and the feed. No I/O here: nothing in
``core`` imports a driver, a socket or another package of this project.
"""
