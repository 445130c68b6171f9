"""Replay: the plan built from a bundle, the session, matching and the replay errors."""
