"""``python -m spark COMMAND``: reconcile, compact, generate, bench (the same as
``eorouter reconcile`` / ``eorouter logs compact`` / ``scripts/gen-logs``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("reconcile", "compact", "generate", "bench")
    if not argv or argv[0] not in commands:
        print(f"usage: python -m spark {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "reconcile":
        from spark.cli import reconcile_main

        return reconcile_main(rest)
    if command == "compact":
        from spark.cli import compact_main

        return compact_main(rest)
    if command == "generate":
        from spark.generate import main as generate_main

        return generate_main(rest)
    from spark.bench import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
