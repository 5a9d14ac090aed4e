"""Children: starting them, containing them, and killing what a dead parent left."""
