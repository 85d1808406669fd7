"""Groups: the group service (send, seq, read marks), administration, the
local group map, membership loading and write diffusion to members' boxes."""
