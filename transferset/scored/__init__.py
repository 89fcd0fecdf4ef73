"""The score stage's library: checks and output preparation (plan), shard protocol (shards)."""
