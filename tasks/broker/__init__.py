"""The broker layer: every Redis key and Lua script, kombu's envelope, the
transport and its ledger, and the one publish path."""
