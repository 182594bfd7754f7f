"""Experience storage between rollouts and the trainer."""
