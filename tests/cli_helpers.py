"""Run `fleetctl` in-process exactly as a user would, capturing exit code and output."""

from __future__ import annotations

from click.testing import CliRunner, Result

from controlplane.cli.main import main


class _Outcome:
    def __init__(self, exit_code: int, output: str, stderr: str) -> None:
        self.exit_code, self.output, self.stderr = exit_code, output, stderr


def run_cli(*args: str, input_text: str | None = None) -> _Outcome:
    """Invoke `fleetctl ARGS` through its real entry point (error mapping included)."""
    runner = CliRunner()
    result: Result = runner.invoke(_entry, list(args), input=input_text, catch_exceptions=False)
    return _Outcome(result.exit_code, result.stdout, result.stderr)


import click  # noqa: E402


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.pass_context
def _entry(ctx: click.Context) -> None:
    main(list(ctx.args))
