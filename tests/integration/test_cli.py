"""The command line's help and options as a new user meets them (issue 14, part 4)."""

from __future__ import annotations

import re

import pytest

from router import cli


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def option_help(text: str, option: str) -> str:
    """The help text argparse prints for ``option`` (its line and continuation lines)."""
    match = re.search(rf"^  {re.escape(option)}\b.*(?:\n {{3,}}\S.*)*", text, re.M)
    assert match, f"{option} is not in the help:\n{text}"
    return " ".join(match.group(0).split())


@pytest.mark.parametrize("command", [("logs", "compact"), ("reconcile",)])
def test_spark_commands_describe_conf(capsys, command):
    described = option_help(help_of(capsys, *command, "--help"), "--conf KEY=VALUE")
    assert "Spark configuration" in described, described


@pytest.mark.parametrize("given", ["debug", "Debug", "DEBUG", "warning"])
def test_log_level_in_any_case(given):
    args = cli._build_parser().parse_args(["run", "--config", "x.toml", "--log-level", given])
    assert args.log_level == given.upper()


def test_an_unknown_log_level_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli._build_parser().parse_args(["run", "--config", "x.toml", "--log-level", "chatty"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'CHATTY'" in capsys.readouterr().err


def test_a_router_runs_at_a_lower_case_log_level(router_factory):
    router = router_factory("L", start=False)
    router.spawn(args=["run", "--config", str(router.write_config()), "--log-level", "warning"])
    router.wait_ready()
    stderr = router.stderr_since_start()
    assert " INFO " not in stderr, f"--log-level warning must hide INFO lines:\n{stderr}"
