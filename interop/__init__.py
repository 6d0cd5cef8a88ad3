"""Interop peers from independent AMQP 1.0 stacks and the matrix that runs them (imports nothing from router)."""
