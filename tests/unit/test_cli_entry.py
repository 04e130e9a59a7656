"""An interrupt while `fleetctl` loads ends as one later does: "error: aborted", exit 130."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

import pytest

from controlplane.cli import entry


class InterruptedWhileLoading(importlib.abc.MetaPathFinder):
    """Ctrl-C arriving while the command line's module is being imported."""

    def find_spec(self, name: str, *_: Any) -> None:
        if name == "controlplane.cli.main":
            raise KeyboardInterrupt
        return None


def test_an_interrupt_while_the_command_line_loads_is_one_line_and_exit_130(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(sys.modules, "controlplane.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptedWhileLoading(), *sys.meta_path])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "error: aborted\n"


def test_the_entry_point_runs_the_command_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["fleetctl", "--help"])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 0
    assert "Fleet control plane" in capsys.readouterr().out
