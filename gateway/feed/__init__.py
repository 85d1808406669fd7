"""The feed: follows, posts, timelines and their fan-out to followers."""
