"""``eorouter``: the command line.

``eorouter run --config router.toml`` runs one router process until SIGTERM or
SIGINT. Startup prints exactly one line to stderr once the listeners are bound,
naming every listener with its role, in config order::

    eorouter: router <id> ready on <role>=<host>:<port>[,<role>=<host>:<port>...] epoch <n>
    eorouter: router A ready on normal=127.0.0.1:5672,inter-router=127.0.0.1:5673 epoch 3

Exit codes: 0 after a graceful shutdown (also when a second signal arrives after
the core answered every publisher delivery), 1 when a second signal cut the drain
short or for a startup failure outside the configuration (data directory locked,
port taken), 2 for an invalid configuration or command line.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

log = logging.getLogger("eorouter")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eorouter", description="Exactly-once AMQP 1.0 topic router.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    run = commands.add_parser("run", help="run one router process", description="Run one router until SIGTERM/SIGINT.")
    run.add_argument("--config", "-c", required=True, metavar="PATH", help="the router's TOML configuration file")
    run.add_argument(
        "--log-level",
        default=None,
        type=str.upper,  # debug and DEBUG alike
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="operational log level on stderr, in any case (default: [logging] level, else INFO)",
    )
    run.set_defaults(func=cmd_run)
    from router import manage, passwd, stat

    stat.register(commands)
    manage.register(commands)
    passwd.register(commands)
    for register in _plugged_commands():
        register(commands)
    return parser


# Commands other packages add (the tools, the Spark proof), found through the
# ``eorouter.commands`` entry points of the installed distribution: the router
# itself imports neither (docs/architecture.md, the import contracts).
COMMANDS_GROUP = "eorouter.commands"


def _plugged_commands():
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            yield entry.load()
        except ImportError as exc:  # a package left out of this install: its command is not offered
            log.debug("command %s unavailable: %s", entry.name, exc)


def _fail(message: str, code: int) -> int:
    print(f"eorouter: {message}", file=sys.stderr, flush=True)
    return code


def configure_logging(settings, level: str | None = None) -> None:
    """Apply ``[logging]``: the level (``--log-level`` wins), per-logger levels, and
    JSON lines instead of text when asked (docs/operations.md, "Logging")."""
    root = logging.getLogger()
    if settings.format == "json":
        from pythonjsonlogger.json import JsonFormatter

        formatter = JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
        )
        for handler in root.handlers:
            handler.setFormatter(formatter)
    root.setLevel(level or settings.level)
    for name, module_level in settings.modules.items():
        logging.getLogger(name).setLevel(module_level)


_LOOPBACK = ("127.", "::1", "localhost")


def _warn_if_open(config, bound: list[tuple[str, int]] | None = None) -> None:
    """A listener other machines can reach, that anyone may use: said loudly at start.
    ``bound``: the listeners' addresses once bound (Server.bind), so that a warning
    names the port a listener got, not a configured 0."""
    for i, lst in enumerate(config.listeners):
        if lst.role != "normal":
            continue
        port = bound[i][1] if bound is not None else lst.port
        if lst.sasl_allow_plain_in_clear:
            log.warning(
                "listener %s:%d accepts SASL PLAIN without TLS (sasl_allow_plain_in_clear): passwords cross "
                "the network readable by anyone on the path",
                lst.host,
                port,
            )
        if lst.host.startswith(_LOOPBACK):
            continue
        authenticated = "ANONYMOUS" not in lst.sasl_mechanisms or (lst.tls is not None and lst.tls.require_client_cert)
        if not authenticated or config.policy is None:
            log.warning(
                "listener %s:%d is reachable from other machines and %s: anyone who reaches it may "
                "publish and subscribe to any topic (docs/security.md)",
                lst.host,
                port,
                "authenticates no one (ANONYMOUS logins, no TLS client certificates)" if not authenticated else "has no [policy]",
            )


def cmd_run(args: argparse.Namespace) -> int:
    from router.config import ConfigError, load_config

    logging.basicConfig(
        level=args.log_level or "INFO", stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    configure_logging(config.logging, args.log_level)

    from router.adapter import Server, fastpath
    from router.adapter.malloc import return_large_buffers_to_the_os
    from router.adapter.sasl import SaslError
    from router.adapter.tls import TlsError
    from router.core import compiled
    from router.core.router import RouterCore
    from router.eventlog import EventLog, EventLogError
    from router.serving import tune_gc_for_serving

    try:
        eventlog = EventLog(
            config.data_dir,
            config.router_id,
            max_bytes=config.eventlog.max_bytes,
            retention=config.eventlog.retention,
            fsync=config.eventlog.fsync,
            buffer=fastpath.log_buffer(),
        )
    except (EventLogError, OSError) as exc:
        return _fail(f"cannot open the event log in {config.data_dir}: {exc}", 1)
    server = metrics = None
    try:
        core = RouterCore(config.core, boot_id=eventlog.boot_id, epoch=eventlog.epoch)
        try:
            server = Server(
                router_id=config.router_id,
                core=core,
                eventlog=eventlog,
                listeners=config.listeners,
                max_message_size=config.core.max_message_size,
                idle_timeout=config.idle_timeout,
                drain_grace=config.drain_grace,
                connectors=config.connectors,
                network=config.network,
                slow_subscriber_age=config.logging.slow_subscriber_age,
                policy=config.policy,
                sasl_settings=config.sasl,
                data_dir=config.data_dir,
            )
        except (TlsError, SaslError) as exc:
            return _fail(str(exc), 2)
        try:
            bound = server.bind()
        except OSError as exc:
            return _fail(exc.strerror or f"cannot listen: {exc}", 1)  # names the address and port
        _warn_if_open(config, bound)
        if config.metrics is not None:
            from router.adapter.metrics import MetricsServer

            try:
                metrics = MetricsServer(server, config.metrics.host, config.metrics.port)
            except OSError as exc:
                return _fail(
                    f"cannot listen on {config.metrics.host}:{config.metrics.port} (metrics listener): {exc.strerror or exc}", 1
                )
            metrics.start()

        def on_signal(signum, frame):
            if server.stop_requested:
                log.warning("%s again: exiting now", signal.Signals(signum).name)
            else:
                log.info("%s: shutting down", signal.Signals(signum).name)
            server.request_stop()

        signal.set_wakeup_fd(server.wakeup_socket(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        tune_gc_for_serving()
        return_large_buffers_to_the_os()
        log.info("subscribers' accepted dispositions and publishers' whole messages: %s path", fastpath.status)
        log.info("the core's publishers' messages and accepted answers: %s path", compiled.status)
        eventlog.flush()  # router-started is on disk before anyone can connect
        addresses = ",".join(
            [f"{lst.role}={lst.host}:{lst.port}" for lst in server.listeners]
            + ([f"metrics={metrics.host}:{metrics.port}"] if metrics is not None else [])
        )
        print(f"eorouter: router {config.router_id} ready on {addresses} epoch {eventlog.epoch}", file=sys.stderr, flush=True)
        return server.run()
    finally:
        # From here on a signal must not kill the process half-way through its exit
        # (Python restores SIG_DFL for handled signals while it finalizes).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if metrics is not None:
            metrics.close()
        if server is not None:
            server.close()
        eventlog.close()


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "demo":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
