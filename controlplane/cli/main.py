"""`fleetctl`: the command-line entry point. Exit codes: 0 done, 1 a decision said no,
2 bad input or usage, 3 an operational failure."""

from __future__ import annotations

import os
import sys

import click
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from controlplane.cli.demo import demo
from controlplane.cli.entry import ABORTED_EXIT_CODE
from controlplane.cli.fit import fit
from controlplane.cli.inspect_cmds import explain, log_command, status, verify
from controlplane.cli.output import fail, one_line
from controlplane.cli.plan import plan
from controlplane.cli.queue_cmds import init, reconcile, submit, up, worker
from controlplane.cli.replay_cmd import replay
from controlplane.cli.simulate import simulate
from controlplane.errors import FleetError, SubmissionRejected
from controlplane.logging import LOG_LEVEL_NAMES, configure_logging
from controlplane.runtime import collect_garbage_less_often
from events.model import NewerLog, UnreadableEvent, UnreadableRow


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", type=click.Choice(LOG_LEVEL_NAMES, case_sensitive=False),
              default=None, help="Log level for stderr (default FLEET_LOG_LEVEL, else WARNING).")
def cli(log_level: str | None) -> None:
    """Fleet control plane for LLM inference: decide, record, replay, explain."""
    configure_logging(log_level)
    collect_garbage_less_often()


for command in (demo, fit, plan, init, submit, worker, up, reconcile, status, log_command, explain, verify,
                replay, simulate):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Run `fleetctl`, mapping typed errors to one clear line and an exit code."""
    try:
        code = cli.main(args=argv, prog_name="fleetctl", standalone_mode=False)
    except click.exceptions.Abort:
        fail("aborted")
        sys.exit(ABORTED_EXIT_CODE)
    except click.UsageError as error:
        fail(error.format_message())
        sys.exit(2)
    except click.ClickException as error:
        fail(error.format_message())
        sys.exit(error.exit_code)
    except SubmissionRejected as error:
        for problem in error.problems:
            click.echo(one_line(str(problem)), err=True)
        fail(str(error))
        sys.exit(error.exit_code)
    except FleetError as error:
        fail(str(error))
        sys.exit(error.exit_code)
    except UnreadableEvent as error:
        fail(f"{error}; `fleetctl verify` checks whether the log was changed")
        sys.exit(3)
    except (UnreadableRow, NewerLog) as error:
        fail(str(error))
        sys.exit(3)
    except SQLAlchemyError as error:
        fail(f"database failure: {error.__class__.__name__}: {getattr(error, 'orig', error)}")
        sys.exit(3)
    except RedisError as error:
        fail(f"Redis failure: {error.__class__.__name__}: {error}")
        sys.exit(3)
    except OSError as error:  # the results' stdout on a full disk, say: not a "no" (exit 1)
        _drop_unwritable_stdout()
        fail(f"system error: {error.strerror or error}"
             + (f" ({error.filename})" if error.filename else ""))
        sys.exit(3)
    sys.exit(code if isinstance(code, int) else 0)


def _drop_unwritable_stdout() -> None:
    """Point stdout at the null device when it cannot take what is left in its buffer, so the
    exit does not fail on it again (Python would print that and exit 120)."""
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    main()
