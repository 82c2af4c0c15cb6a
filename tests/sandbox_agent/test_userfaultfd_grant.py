"""vm.unprivileged_userfaultfd is 1 only while some agent of the host needs it for lazy restores.

A plain file stands in for /proc/sys/vm/unprivileged_userfaultfd: the real one is the host's,
and the suite's own agents hold it meanwhile (`test_lazy_restore.py` restores under it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_agent.criu.userfaultfd import UNPRIVILEGED_USERFAULTFD, UserfaultfdGrant


def grant(tmp_path: Path) -> UserfaultfdGrant:
    return UserfaultfdGrant(tmp_path / "sysctl", tmp_path / "lock", tmp_path / "prior")


@pytest.mark.timeout(30)
def test_the_last_agent_to_stop_puts_the_hosts_value_back(tmp_path: Path) -> None:
    sysctl = tmp_path / "sysctl"
    sysctl.write_text("0\n")
    first, second = grant(tmp_path), grant(tmp_path)
    assert first.acquire() == "" and second.acquire() == ""
    assert sysctl.read_text() == "1\n"
    first.release()
    assert sysctl.read_text() == "1\n", "another agent still restores lazily"
    second.release()
    assert sysctl.read_text() == "0\n"
    second.release()  # a second close changes nothing
    assert sysctl.read_text() == "0\n" and not (tmp_path / "prior").exists()


@pytest.mark.timeout(30)
def test_an_agent_that_died_holding_it_does_not_make_1_the_hosts_value(tmp_path: Path) -> None:
    sysctl = tmp_path / "sysctl"
    sysctl.write_text("0\n")
    died = (
        "import sys; from pathlib import Path; from sandbox_agent.criu.userfaultfd import UserfaultfdGrant; "
        "d = Path(sys.argv[1]); assert UserfaultfdGrant(d / 'sysctl', d / 'lock', d / 'prior').acquire() == ''"
    )
    subprocess.run([sys.executable, "-c", died, str(tmp_path)], check=True)  # exits without release
    assert sysctl.read_text() == "1\n"
    restarted = grant(tmp_path)
    assert restarted.acquire() == ""
    restarted.release()
    assert sysctl.read_text() == "0\n", "the value found before the first agent, not the dead one's 1"


@pytest.mark.timeout(30)
def test_a_sysctl_it_cannot_write_is_reported_not_raised(tmp_path: Path) -> None:
    g = UserfaultfdGrant(tmp_path / "absent" / "sysctl", tmp_path / "lock", tmp_path / "prior")
    assert "absent" in g.acquire()
    g.release()
    assert UNPRIVILEGED_USERFAULTFD.name == "unprivileged_userfaultfd"
