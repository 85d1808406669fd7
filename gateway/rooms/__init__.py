"""Live rooms: the room service (join, leave, room_send, counts), the local
room map and its coalescing writer, positions for history and recovery."""
