"""The partial-response pool: in-progress trajectories kept on CPU so a failed rollout loses no work."""
