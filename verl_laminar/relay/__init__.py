"""Relay weight service: host-memory relays, pipelined chain broadcast, pull-anytime reads.

Import the pieces from their modules (``relay.relay.Relay``, ``relay.store.StoreReader``, ...);
this package imports nothing heavy so that a relay process starts without torch.
"""
