"""The broker layer: every Redis key and Lua script, kombu's envelope, the queue
protocol and its kombu transport, and the one publish path."""
