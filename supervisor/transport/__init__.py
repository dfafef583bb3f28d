"""ZeroMQ endpoints and the versioned message schema."""
