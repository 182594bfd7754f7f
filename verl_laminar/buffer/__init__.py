"""Experience storage between rollouts and the trainer."""

# How often a trainer's sampling loop reads TransferQueue's metadata while it waits for groups. verl's
# ReplayBuffer sleeps 2.0 s between reads, so every wait is rounded up to a multiple of 2 s (measured: the
# trainer's wait-for-data was 2.008 s for data that was 10 ms late). A read is one small actor call.
POLL_S = 0.1
