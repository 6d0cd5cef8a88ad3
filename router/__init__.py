"""eorouter: exactly-once topic publish/subscribe over AMQP 1.0 routers."""

__version__ = "0.1.0"
